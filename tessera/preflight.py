"""`tessera serve` checks every flag of every service before it starts any process or any
model loads: a mistake costs a second, not the minutes a checkpoint takes to load, and
each service with a mistake gets one line naming it and the flag:

    decoder: --kv-cache-memory-fraction must be in [0, 1), got 1.5
    gateway: --limit-mm-per-prompt: unknown modality 'video'; tessera takes image, audio

Each service's flags are parsed by its own parser and built into its own config (so the
checks the services make themselves are made here too, and written once); on top of that,
what a service would only find out at start: numeric bounds, files that must be there,
the model's path or hub id, the device.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tessera.launcher import Replica

SERVICES = ("encoder", "decoder", "gateway")


@dataclass(frozen=True)
class Problem:
    """One service's first mistake."""

    service: str
    message: str

    def line(self) -> str:
        return f"{self.service}: {self.message}"


class FlagError(ValueError):
    """A flag argparse refused (the message names it)."""


class _CheckingParser(argparse.ArgumentParser):
    """Raises FlagError instead of printing the usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise FlagError(message.removeprefix("argument "))


@dataclass(frozen=True)
class Bound:
    """A number a flag must hold: `low <= value` (or `<`), and `value <= high`."""

    low: float
    high: float | None = None
    low_open: bool = False

    def check(self, value: float) -> str | None:
        too_low = value <= self.low if self.low_open else value < self.low
        if too_low or (self.high is not None and value > self.high):
            return f"must be {self.describe()}, got {value:g}"
        return None

    def describe(self) -> str:
        if self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        return f"{'>' if self.low_open else '>='} {self.low:g}"


AT_LEAST_ONE = Bound(1)
NOT_NEGATIVE = Bound(0)
POSITIVE = Bound(0, low_open=True)

# Bounds of the flags no service config checks itself; a flag a service does not take is
# skipped. (The decoder's --max-chunk-tokens, --block-size, --kv-cache-bytes and
# --kv-cache-memory-fraction are checked by DecoderConfig.from_args.)
BOUNDS: Mapping[str, Bound] = {
    **dict.fromkeys(
        [
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "default_max_tokens",
            "lease_ms",
            "default_lease_ms",
            "max_lease_ms",
            "compute_lease_ms",
            "max_batch_items",
            "max_slices_per_call",
            "max_slice_bytes_per_call",
            "slice_message_bytes",
            "redis_max_connections",
            "max_request_bytes",
            "max_media_bytes",
            "max_image_pixels",
            "max_request_pixels",
        ],
        AT_LEAST_ONE,
    ),
    **dict.fromkeys(
        [
            "cache_bytes",
            "max_pinned_bytes",
            "max_pinned_bytes_per_owner",
            "max_batch_pixels",
            "max_batch_wait_ms",
            "max_prefetch_bytes",
            "decode_kv_mirror_bytes",
            "max_queued_requests",
            "drain_seconds",
            "replica_retry_seconds",
            "remote_wait_seconds",
        ],
        NOT_NEGATIVE,
    ),
    **dict.fromkeys(
        [
            "max_audio_seconds",
            "request_timeout_seconds",
            "media_fetch_timeout_seconds",
            "fetch_timeout_seconds",
            "replica_refresh_seconds",
            "redis_ttl_seconds",
            "redis_timeout_seconds",
        ],
        POSITIVE,
    ),
}

# Flags naming a file the service reads at start.
FILE_DESTS = (
    "tls_cert_file",
    "tls_key_file",
    "tls_ca_file",
    "api_key_file",
    "redis_password_file",
    "redis_tls_ca_file",
    "redis_tls_cert_file",
    "redis_tls_key_file",
    "cache_mac_key_file",
)


def service_parser(
    service: str, parser_class: type[argparse.ArgumentParser] = _CheckingParser
) -> argparse.ArgumentParser:
    """`service`'s flags (those of `tessera <service>`: its main adds none of its own) on
    a parser of `parser_class`, by default one that raises FlagError rather than exiting.
    Built from the config modules, which import no torch: fast enough for `serve`."""
    parser = parser_class(prog=f"tessera {service}", add_help=False)
    _flag_adders()[service](parser)
    return parser


def service_parsers(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
) -> dict[str, argparse.ArgumentParser]:
    """Each service's parser (for routing serve's flags), by service name."""
    return {service: service_parser(service, parser_class) for service in SERVICES}


def check_service(service: str, argv: Sequence[str], check_model: bool = True) -> Problem | None:
    """The first mistake in `tessera <service> <argv>`, or None. `check_model=False`
    when the checkpoint is made later (serve's demo model)."""
    parser = service_parser(service)
    try:
        args = parser.parse_args(list(argv))
    except FlagError as error:
        return Problem(service, str(error))
    checks: list[Callable[[], str | None]] = [
        lambda: _bounds(parser, args),
        lambda: _files(parser, args),
        lambda: model_problem(args.model) if check_model else None,
        lambda: _config_problem(service, args),
        lambda: _device_problem(getattr(args, "device", None)),
    ]
    for check in checks:
        message = check()
        if message:
            return Problem(service, message)
    return None


def bounds_problem(service: str, args: argparse.Namespace) -> str | None:
    """A number flag of `tessera <service>` outside its bound (BOUNDS), or None: the check
    `serve` makes before it starts anything, for a service started on its own."""
    return _bounds(service_parser(service), args)


def check_services(argv: Mapping[str, Sequence[str]], check_model: bool = True) -> list[Problem]:
    """The first mistake of each service in `argv` (service -> its arguments)."""
    found = [check_service(service, args, check_model) for service, args in argv.items()]
    return [problem for problem in found if problem is not None]


def check_serve(
    replicas: Sequence[Replica],
    host: str,
    gateway_ports: Mapping[str, int],
    check_model: bool = True,
) -> list[Problem]:
    """The first mistake of each service `tessera serve` would start (its replicas differ
    only in ports, so the first of each stands for all), and whether the ports the
    gateway was given (flag -> port) are free and distinct."""
    first: dict[str, Sequence[str]] = {}
    for replica in replicas:
        first.setdefault(replica.service, replica.args)
    problems = check_services(first, check_model)
    if all(problem.service != "gateway" for problem in problems):
        taken = ports_in_use(host, gateway_ports)
        given = [port for port in gateway_ports.values() if port]
        if len(set(given)) < len(given):
            taken.insert(0, f"{' and '.join(gateway_ports)} must differ, got {given}")
        problems += [Problem("gateway", message) for message in taken[:1]]
    return problems


def ports_in_use(host: str, ports: Mapping[str, int]) -> list[str]:
    """Of `ports` (flag -> port; 0 is skipped), those another process holds on `host`:
    `--port 50051 is in use on 127.0.0.1`. Checked by binding, as the service will."""
    problems = []
    for flag, port in ports.items():
        if not port:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError as error:
                problems.append(f"{flag} {port} is in use on {host} ({error.strerror})")
    return problems


def model_problem(model: str) -> str | None:
    """What is wrong with `--model`, or None: a path must be a checkpoint directory of a
    supported architecture; anything else must have the shape of a hub id."""
    path = Path(model).expanduser()
    if not (path.exists() or model.startswith((".", "/", "~"))):
        return _hub_id_problem(model)
    if not path.is_dir():
        what = "is not a directory" if path.exists() else "does not exist"
        return f"--model {model} {what}; give a checkpoint directory or a hub id"
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        return f"--model {model} has no config.json: it is not a checkpoint directory"
    except (OSError, ValueError) as error:
        return f"--model {model}: cannot read config.json: {error}"
    from tessera.architectures import supported_architectures

    architectures = config.get("architectures") if isinstance(config, dict) else None
    architecture = (architectures or ["(none)"])[0]
    if architecture not in supported_architectures():
        return (
            f"--model {model}: architecture {architecture} is not supported; supported: "
            f"{', '.join(supported_architectures())}"
        )
    return None


def _hub_id_problem(model: str) -> str | None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError:
        return (
            f"--model {model} is neither a directory nor a hub id such as "
            "Qwen/Qwen2.5-VL-7B-Instruct"
        )
    return None


def _flag(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return f"--{dest.replace('_', '-')}"


def _bounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    for dest, bound in BOUNDS.items():
        value = getattr(args, dest, None)
        if value is None or isinstance(value, bool):
            continue
        problem = bound.check(value)
        if problem:
            return f"{_flag(parser, dest)} {problem}"
    return None


def _files(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    for dest in FILE_DESTS:
        value = getattr(args, dest, None)
        if value is None:
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            what = "is not a file" if path.exists() else "does not exist"
            return f"{_flag(parser, dest)} {value} {what}"
        if not os.access(path, os.R_OK):
            return f"{_flag(parser, dest)} {value} cannot be read (permissions)"
    return _tls_problem(args)


def _tls_problem(args: argparse.Namespace) -> str | None:
    from tessera.tls import TlsFiles, read_material

    try:
        files = TlsFiles(args.tls_cert_file, args.tls_key_file, args.tls_ca_file)
        read_material(files)
    except (OSError, ValueError) as error:
        return f"the TLS files (--tls-cert-file, --tls-key-file, --tls-ca-file): {error}"
    return None


def _config_problem(service: str, args: argparse.Namespace) -> str | None:
    """What the service's own config checks refuse (they exit with the message)."""
    try:
        with _quiet():
            config = _configs()[service](args)
            if service == "encoder" and config.redis_url:
                _check_redis_secrets(config)
    except SystemExit as error:
        return str(error.code).removeprefix(f"tessera {service}: ")
    except ValueError as error:
        return str(error)
    return None


def _check_redis_secrets(config) -> None:
    from encoder_service.entry_mac import EntryMac
    from encoder_service.redis_connection import connection_from_config

    connection_from_config(config)  # reads the password file
    if config.cache_mac_key_file:
        EntryMac.from_file(config.cache_mac_key_file)


def _device_problem(device: str | None) -> str | None:
    if device is None or device == "cpu":
        return None
    import torch  # only for other devices: importing it costs seconds

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        return f"--device {device} is not a torch device (cpu, cuda, cuda:1, ...)"
    if parsed.type == "cuda":
        available = torch.cuda.device_count()
        if (parsed.index is not None and parsed.index >= available) or not available:
            return f"--device {device}: this machine has {available} CUDA device(s)"
    return None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Config checks log warnings meant for a running service; not here."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _flag_adders() -> dict[str, Callable[[argparse.ArgumentParser], None]]:
    from decoder_service.config import add_decoder_flags
    from encoder_service.config import add_encoder_flags
    from gateway.config import add_gateway_flags

    return {
        "encoder": add_encoder_flags,
        "decoder": add_decoder_flags,
        "gateway": add_gateway_flags,
    }


def _configs() -> dict[str, Callable[[argparse.Namespace], object]]:
    from decoder_service.config import DecoderConfig
    from encoder_service.config import EncoderConfig
    from gateway.config import GatewayConfig

    return {
        "encoder": EncoderConfig.from_args,
        "decoder": DecoderConfig.from_args,
        "gateway": GatewayConfig.from_args,
    }
