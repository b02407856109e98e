"""Flags every service shares. Environment variables only provide defaults, read when the
parser is built (never at import time)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tessera.logs import LOG_FORMATS, add_log_format_flag
from tessera.startup_flags import dtype_flag, log_level, port_number

T = TypeVar("T")
C = TypeVar("C")


def env_default(name: str, default: T, parse: Callable[[str], T] = str) -> T:  # type: ignore[assignment]
    """`parse(os.environ[name])` if set, else `default`."""
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else parse(raw)


def _log_format(value: str) -> str:
    if value not in LOG_FORMATS:
        raise SystemExit(f"TESSERA_LOG_FORMAT={value!r}: use one of {', '.join(LOG_FORMATS)}")
    return value


def served_model_names(model: str, override: Sequence[str] | str | None) -> list[str]:
    """The model's names in the API (--served-model-name, as many as given): `override`,
    else the checkpoint directory's (or hub id's) last part, never its path.

    Example: served_model_names("/models/llava-1.5/", None) == ["llava-1.5"]
    """
    if isinstance(override, str):
        override = [override]
    return list(dict.fromkeys(override)) if override else [Path(model.rstrip("/")).name or model]


def served_model_name(model: str, override: Sequence[str] | str | None) -> str:
    """The first of the served names: the one responses carry and metrics' `model_name`
    label.

    Example: served_model_name("/models/llava-1.5/", None) == "llava-1.5"
    """
    return served_model_names(model, override)[0]


def add_served_model_name_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="the model's names in the API: /v1/models lists them, requests may name any; "
        "the first is the one responses and metrics' model_name label carry (default: the "
        "checkpoint directory's name)",
    )


@dataclass(frozen=True)
class Secret:
    """A value kept out of every repr (logs, tracebacks, argparse namespaces)."""

    value: str = field(repr=False)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=env_default("TESSERA_MODEL", None),
        required=env_default("TESSERA_MODEL", None) is None,
        help="checkpoint directory or hub id (env TESSERA_MODEL)",
    )
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--dtype",
        default="auto",
        type=dtype_flag,
        help="weights and activations dtype: auto (the checkpoint's config.json dtype; "
        "float32 on a CPU for a half-precision checkpoint), float32, bfloat16, float16",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch's intra-op threads in this process (0: one per CPU the process may use, "
        "by its affinity mask and cgroup CPU quota); tessera serve splits one host's CPUs "
        "between the services it starts",
    )
    parser.add_argument(
        "--model-fingerprint",
        default=None,
        help="override the fingerprint computed from the checkpoint's files "
        "(must be the same on the gateway and every encoder)",
    )


def add_common_flags(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=port_number, default=default_port, help="gRPC port (0 = any free)"
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM, how long in-flight requests get to finish",
    )
    parser.add_argument(
        "--log-level",
        type=log_level,
        default=env_default("TESSERA_LOG_LEVEL", "INFO"),
        help="debug, info, warning, error (env TESSERA_LOG_LEVEL); debug also prints the "
        "traceback of a start-up failure",
    )
    add_log_format_flag(parser, env_default("TESSERA_LOG_FORMAT", "text", _log_format))
    parser.add_argument(
        "--enable-reflection",
        action="store_true",
        help="serve gRPC server reflection (for grpcurl and the like; off: it hands out "
        "the API's whole schema to anyone who may connect)",
    )
    parser.add_argument(
        "--health-port",
        type=port_number,
        default=0,
        help="also serve grpc.health.v1, and nothing else, in plaintext on this port "
        "(0: off), for probes that cannot present a client certificate (the kubelet's)",
    )


def config_from_args(cls: Callable[..., C], args: argparse.Namespace, **built: Any) -> C:
    """A service config dataclass: `built` fields as given (settings made of several
    flags), every other field from the flag of its name."""
    names = [name for name in cls.__dataclass_fields__ if name not in built]  # type: ignore[attr-defined]
    return cls(**{name: getattr(args, name) for name in names}, **built)


def address_list(value: str) -> tuple[str, ...]:
    """Replica targets, each `host:port` or `dns:///name:port` (tessera.replicas).

    `"10.0.0.1:50052, dns:///tessera-encoder:50052"` ->
    `("10.0.0.1:50052", "dns:///tessera-encoder:50052")`
    """
    addresses = tuple(a.strip() for a in value.split(",") if a.strip())
    if not addresses:
        raise argparse.ArgumentTypeError("give at least one host:port")
    return addresses


def add_address_flag(
    parser: argparse.ArgumentParser, flag: str, env: str, help: str, required: bool = True
) -> None:
    """A list of replica targets (`--encoders`, `--decoders`), defaulting to `env`. An
    optional one defaults to no targets at all."""
    default = env_default(env, None if required else (), address_list)
    parser.add_argument(
        flag,
        type=address_list,
        default=default,
        required=default is None,
        help=f"{help} (env {env})",
    )


def add_replica_flags(parser: argparse.ArgumentParser) -> None:
    """How a service keeps its view of the replicas it calls (tessera.replicas)."""
    parser.add_argument(
        "--replica-refresh-seconds",
        type=float,
        default=5.0,
        help="how often replicas are resolved again and health-checked",
    )
    parser.add_argument(
        "--replica-retry-seconds",
        type=float,
        default=5.0,
        help="how long a failed replica is set aside before it is tried again",
    )
