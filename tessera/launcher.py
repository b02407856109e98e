"""`tessera serve`: the whole system as separate processes on localhost.

Starts the encoders, the decoders and the gateway (each exactly as `tessera encoder|decoder|
gateway` would, which is how Kubernetes runs them), waits until every one reports SERVING
on grpc.health.v1, prints where to connect (and each replica's address and pid), and stops
them all on Ctrl-C or SIGTERM.

With `--encoders N --decoders M` it mirrors a cluster on loopback: N encoder replicas
(sharing `--redis-url` if given, like the encoder Deployment), M decoder replicas that
each get every encoder's address, and a gateway that gets every replica's address. A
replica that dies is reported and routed around, as in a cluster (without the restart);
serve stops when the gateway or the last replica of a service is gone.

With `--colocated` there is no encoder service: each decoder runs the encoder in its own
process (`--colocated-encoder`, as vLLM v1 does by default) and the gateway sends no
Encode, only the decoders' addresses.

With `--tls auto` it makes a throwaway CA and one certificate per role in a temporary
directory (removed on exit; tessera.certs), starts every service with mutual TLS on its
role's certificate, and prints the `client` certificate to connect with.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.children import Child, start_child, stop_children, wait_healthy
from tessera.cpus import shared_host_expedite_threads, shared_host_torch_threads, usable_cpus
from tessera.tls import TlsFiles, tls_args

# Flags `serve` sets on the services itself; they cannot be passed through.
_OWN_FLAGS = {"--model", "--port", "--host", "--encoders", "--decoders", "--metrics-port"}
_TLS_FLAGS = {"--tls-cert-file", "--tls-key-file", "--tls-ca-file"}
METRICS_FLAG = "--metrics-port"


@dataclass(frozen=True)
class Replica:
    """One process `serve` starts: `tessera <service> <args>` listening on `address`."""

    name: str  # "encoder" (the only one) or "encoder-0", "encoder-1", ...
    service: str  # "encoder", "decoder" or "gateway"
    address: str
    args: list[str]
    metrics_port: int | None = None


# Ports this process has handed out. A port given to a child that has not bound it yet
# (it is still importing torch) looks free to the kernel: without this, two children
# started a moment apart could be given the same port, and the second fails to start.
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, and never one this process handed out before."""
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def distinct_free_ports(host: str, taken: Collection[int] = ()) -> Iterator[int]:
    """Free ports, never the same one twice nor one of `taken`."""
    seen: set[int] = set(taken)
    while True:
        port = free_port(host)
        if port not in seen:
            seen.add(port)
            yield port


def route_flags(
    extra: list[str], parsers: dict[str, argparse.ArgumentParser]
) -> dict[str, list[str]]:
    """Sends each extra flag (with its value) to every service whose parser knows it.

    `["--max-chunk-tokens", "16", "--device=cpu"]` -> decoder gets the first, encoder and
    decoder get `--device=cpu`.
    """
    routed: dict[str, list[str]] = {name: [] for name in parsers}
    index = 0
    while index < len(extra):
        token = extra[index]
        flag = token.split("=", 1)[0]
        if flag in _OWN_FLAGS:
            raise SystemExit(f"tessera serve sets {flag} itself; use serve's own options")
        if flag in _TLS_FLAGS:
            raise SystemExit(f"tessera serve gives each service its own {flag}: use --tls auto")
        if flag == "--allow-callers":  # the methods differ per service
            raise SystemExit(
                "tessera serve cannot route --allow-callers; start the services one by one"
            )
        owners = [name for name, p in parsers.items() if flag in p._option_string_actions]
        if not owners:
            raise SystemExit(f"no service takes {flag}; see tessera encoder|decoder|gateway --help")
        action = parsers[owners[0]]._option_string_actions[flag]
        group = extra[index : index + 1 + _num_values(action, token, extra[index + 1 :])]
        for name in owners:
            routed[name] += group
        index += len(group)
    return routed


def _num_values(action: argparse.Action, token: str, rest: list[str]) -> int:
    """How many of the tokens after `token` are its values: none for a switch or
    `--flag=value`, all up to the next flag for a list (`--served-model-name a b`), else one."""
    if action.nargs == 0 or "=" in token:
        return 0
    if action.nargs in ("+", "*"):
        values = 0
        while values < len(rest) and not rest[values].startswith("-"):
            values += 1
        return values
    return 1


def metrics_services(parsers: dict[str, argparse.ArgumentParser]) -> set[str]:
    """The services whose parser takes --metrics-port (each replica then gets its own)."""
    return {name for name, p in parsers.items() if METRICS_FLAG in p._option_string_actions}


def plan_replicas(
    model: str,
    host: str,
    gateway_port: int,
    routed: dict[str, list[str]],
    encoders: int = 1,
    decoders: int = 1,
    redis_url: str | None = None,
    with_metrics: Collection[str] = (),
    ports: Iterator[int] | None = None,
    tls: Mapping[str, TlsFiles] | None = None,
    colocated: bool = False,
    cpus: int | None = None,
) -> list[Replica]:
    """What to start, in start order: the encoders, the decoders with every encoder
    address, then the gateway with every encoder and decoder address. The flags mirror the
    Kubernetes manifests: the encoders share `--redis-url`, the decoders and the gateway
    list the replicas they call (there through DNS). With `tls` (files per role), each
    service gets the files of the role named like it. `colocated`: no encoders, each
    decoder encodes in its own process. They share this host's `cpus` (default: the ones
    this process may use): each gets --torch-threads by `shared_host_torch_threads`
    unless the flag was routed to it."""
    if decoders < 1 or (encoders < 1 and not colocated):
        raise SystemExit("tessera serve needs at least one encoder and one decoder")
    if colocated and redis_url:
        raise SystemExit("tessera serve --colocated: the decoders' encoders keep no Redis cache")
    ports = ports or distinct_free_ports(host, taken={gateway_port})
    common = ["--model", model, "--host", host]
    cpus = cpus or usable_cpus()
    counts = {"encoder": 0 if colocated else encoders, "decoder": decoders, "gateway": 1}
    replicas: list[Replica] = []

    def add(service: str, index: int, count: int, port: int, extra: list[str]) -> Replica:
        name = service if count == 1 else f"{service}-{index}"
        metrics_port = next(ports) if service in with_metrics else None
        metrics = [METRICS_FLAG, str(metrics_port)] if metrics_port is not None else []
        security = tls_args(tls[service]) if tls else []
        threads = torch_threads_flag(service, cpus, counts[service], routed[service])
        args = [*common, "--port", str(port), *metrics, *security, *threads, *extra]
        args += routed[service]
        replica = Replica(name, service, f"{host}:{port}", args, metrics_port)
        replicas.append(replica)
        return replica

    redis = ["--redis-url", redis_url] if redis_url else []
    if colocated:
        encoders, encoder_flag = 0, ["--colocated-encoder"]
    encoder_list = [add("encoder", i, encoders, next(ports), redis) for i in range(encoders)]
    if not colocated:
        encoder_flag = ["--encoders", ",".join(r.address for r in encoder_list)]
    decoder_list = [add("decoder", i, decoders, next(ports), encoder_flag) for i in range(decoders)]
    gateway_encoders = [] if colocated else encoder_flag
    add(
        "gateway",
        0,
        1,
        gateway_port,
        [*gateway_encoders, "--decoders", ",".join(r.address for r in decoder_list)],
    )
    return replicas


def torch_threads_flag(
    service: str, cpus: int, num_replicas: int, flags: Collection[str]
) -> list[str]:
    """`--torch-threads N` for one of `num_replicas` of `service` on a host of `cpus`
    shared with the others, and an encoder's `--expedite-torch-threads`, each unless
    `flags` already set it."""
    given = {flag.split("=", 1)[0] for flag in flags}
    threads = []
    if "--torch-threads" not in given:
        threads += ["--torch-threads", str(shared_host_torch_threads(service, cpus, num_replicas))]
    if service == "encoder" and "--expedite-torch-threads" not in given:
        threads += [
            "--expedite-torch-threads",
            str(shared_host_expedite_threads(cpus, num_replicas)),
        ]
    return threads


class Watch:
    """Notices children that exit: a replica is reported and left out while another of
    its service runs; the gateway or the last replica of a service ends `serve`."""

    def __init__(self, replicas: list[Replica], children: list[Child]):
        self.service = {c.name: r.service for r, c in zip(replicas, children, strict=True)}
        self.running = list(children)

    def check(self, report: Callable[[str], None]) -> None:
        for child in list(self.running):
            code = child.process.poll()
            if code is None:
                continue
            self.running.remove(child)
            service = self.service[child.name]
            left = sum(self.service[c.name] == service for c in self.running)
            if service == "gateway" or left == 0:
                raise SystemExit(f"the {child.name} exited with code {code}")
            report(
                f"tessera serve: the {child.name} ({child.address}, pid {child.process.pid}) "
                f"exited with code {code}; {left} {service}(s) left, the gateway routes "
                f"around it"
            )


def serve_all(
    model: str,
    host: str,
    port: int,
    routed: dict[str, list[str]],
    ready_timeout: float,
    encoders: int = 1,
    decoders: int = 1,
    redis_url: str | None = None,
    with_metrics: Collection[str] = (),
    http_port: int = 0,
    auto_tls: bool = False,
    colocated: bool = False,
) -> None:
    tls_dir = Path(tempfile.mkdtemp(prefix="tessera-tls-")) if auto_tls else None
    tls = _role_certificates(tls_dir, host) if tls_dir else None
    replicas = plan_replicas(
        model,
        host,
        port,
        routed,
        encoders,
        decoders,
        redis_url,
        with_metrics,
        tls=tls,
        colocated=colocated,
    )
    client = tls["client"] if tls else None
    children: list[Child] = []
    stop = {"requested": False}

    def on_signal(signum, frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for replica in replicas:
            process = start_child(replica.service, replica.args)
            children.append(Child(replica.name, replica.address, process))
        wait_healthy(children, ready_timeout, client)
        print_ready(replicas[-1].address, model, replicas, children, http_port, client)
        watch = Watch(replicas, children)
        while not stop["requested"]:
            watch.check(lambda line: print(line, file=sys.stderr, flush=True))
            time.sleep(0.5)
    finally:
        stop_children(children)
        if tls_dir:
            shutil.rmtree(tls_dir, ignore_errors=True)


def _role_certificates(directory: Path, host: str) -> dict[str, TlsFiles]:
    from tessera.certs import write_role_certificates

    return write_role_certificates(directory, extra_hosts=[host])


def example_media(model: str) -> str:
    """The example request's media and prompt: a clip for a checkpoint with an audio
    encoder (its config has an `audio_config`), else an image."""
    try:
        config = json.loads((Path(model).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    if "audio_config" in config:
        return '--audio clip.wav "What do you hear?"'
    return '--image some.png "Describe the image."'


def print_ready(
    gateway: str,
    model: str,
    replicas: list[Replica],
    children: list[Child],
    http_port: int = 0,
    client: TlsFiles | None = None,
) -> None:
    tessera = Path(sys.executable).with_name("tessera")
    command = str(tessera) if tessera.exists() else "tessera"
    lines = []
    for replica, child in zip(replicas, children, strict=True):
        metrics = (
            f"  metrics http://{replica.address.rsplit(':', 1)[0]}:{replica.metrics_port}/metrics"
            if replica.metrics_port is not None
            else ""
        )
        lines.append(
            f"    {replica.name:<10} {replica.address:<21} pid {child.process.pid}{metrics}\n"
        )
    host = gateway.rsplit(":", 1)[0]
    http = (
        f"  OpenAI API: http://{host}:{http_port}/v1   (POST /chat/completions)\n"
        if http_port
        else ""
    )
    security = (
        f"  mutual TLS: connect with the client certificate {client.cert_file}\n"
        f"    (key {client.key_file}, CA {client.ca_file}; removed on exit)\n"
        if client
        else ""
    )
    flags = "".join(f"{part} " for part in tls_args(client)) if client else ""
    print(
        f"\nTessera is ready.\n"
        f"  gateway (gRPC): {gateway}   model: {model}\n"
        f"{http}"
        f"{security}"
        f"  replicas:\n{''.join(lines)}"
        f"  try:  {command} generate --server {gateway} {flags}{example_media(model)}\n"
        f"  stop: Ctrl-C\n",
        flush=True,
    )
