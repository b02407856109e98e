"""What every Tessera gRPC server shares: health, TLS and caller checks, reflection (on
request), a loading phase, a start line, and a clean shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tessera import __version__
from tessera.access import AccessRules, CallerCheck
from tessera.server_errors import PortTakenError, StartupError, one_line
from tessera.tls import TlsFiles, server_credentials

log = logging.getLogger("tessera")

# Well above the 1 MiB slice messages and large prompts with several images.
MAX_MESSAGE_BYTES = 64 << 20
# After a service's own drain: time for the calls it ended to send their status.
_FLUSH_SECONDS = 1.0
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True)
class ServerSpec:
    """How one service is started."""

    name: str  # "encoder", "decoder", "gateway"
    host: str
    port: int
    model: str
    drain_seconds: float
    service_names: Sequence[str]  # full gRPC service names, for health and reflection
    tls: TlsFiles = field(default_factory=TlsFiles)
    access: AccessRules | None = None  # checked only with mutual TLS
    enable_reflection: bool = False
    # A plaintext port serving only grpc.health.v1 (0: none), for probes without a
    # client certificate.
    health_port: int = 0


def service_spec(name: str, config: Any) -> ServerSpec:
    """A ServerSpec from a service config that has host, port, model, drain_seconds, tls,
    access (whose service is the one served), enable_reflection and health_port."""
    return ServerSpec(
        name=name,
        host=config.host,
        port=config.port,
        model=config.model,
        drain_seconds=config.drain_seconds,
        service_names=[config.access.service],
        tls=config.tls,
        access=config.access,
        enable_reflection=config.enable_reflection,
        health_port=config.health_port,
    )


def _interceptors(spec: ServerSpec) -> list[grpc.aio.ServerInterceptor]:
    """A caller check when callers have verified names (mutual TLS); none otherwise, and
    a warning, since then anyone who reaches the port may call every method."""
    if spec.tls.mutual and spec.access is not None:
        log.info("callers allowed by certificate name: %s", spec.access.describe())
        return [CallerCheck(spec.access)]
    kind = "TLS without client certificates" if spec.tls.enabled else "plaintext"
    log.warning(
        "tessera %s accepts unauthenticated callers (%s): give --tls-cert-file, "
        "--tls-key-file and --tls-ca-file for mutual TLS",
        spec.name,
        kind,
    )
    return []


def _add_port(server: grpc.aio.Server, spec: ServerSpec) -> int:
    address = f"{spec.host}:{spec.port}"
    try:
        if spec.tls.enabled:
            return server.add_secure_port(address, server_credentials(spec.tls))
        return server.add_insecure_port(address)
    except RuntimeError:
        return 0


def _health_server(
    spec: ServerSpec, servicer: health.aio.HealthServicer
) -> tuple[grpc.aio.Server, str] | None:
    """The plaintext health-only server on `spec.health_port` and its address, or None if
    the port is 0. The kubelet's grpc probes cannot present a client certificate, so under
    mutual TLS they need a port of their own. It shares `servicer` with the main server,
    so both report the same status, and it has no caller check: it serves nothing but
    SERVING/NOT_SERVING, and every other method is UNIMPLEMENTED there."""
    if not spec.health_port:
        return None
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = f"{spec.host}:{spec.health_port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise PortTakenError(f"could not bind the health port {address}: is another server on it?")
    return server, address


def redact(url: str | None) -> str:
    """A URL fit for logs: any password replaced by ***."""
    if not url:
        return "off"
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


async def serve(
    spec: ServerSpec,
    add_servicers: Callable[[grpc.aio.Server], None],
    load: Callable[[], Awaitable[str]],
    stop_event: asyncio.Event | None = None,
    drain: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Starts the server NOT_SERVING, runs `load()` (which returns a short description of
    what was loaded, for the start line), flips health to SERVING, and serves until SIGTERM
    or SIGINT (or `stop_event`). On stop: health flips to NOT_SERVING at once, then
    in-flight calls get `spec.drain_seconds` to finish. A service with long calls passes
    `drain(seconds)`, which waits for them and then ends the rest itself with a status
    (gRPC would cancel them, and log a traceback for each)."""
    # No SO_REUSEPORT: a second server on a taken port must fail, not silently split the
    # port's clients with the first.
    server = grpc.aio.server(
        options=[*GRPC_OPTIONS, ("grpc.so_reuseport", 0)], interceptors=_interceptors(spec)
    )
    add_servicers(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if spec.enable_reflection:  # off by default: it hands out the whole API's schema
        names = [*spec.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)
    port = _add_port(server, spec)
    if port == 0:
        raise PortTakenError(f"could not bind {spec.host}:{spec.port}: is another server on it?")
    health_only = _health_server(spec, health_servicer)
    await _set_health(
        health_servicer, spec.service_names, health_pb2.HealthCheckResponse.NOT_SERVING
    )
    await server.start()
    if health_only is not None:
        await health_only[0].start()
    address = f"{spec.host}:{port}"
    transport = "mtls" if spec.tls.mutual else "tls" if spec.tls.enabled else "plaintext"
    health_address = health_only[1] if health_only is not None else "off"
    log.info("tessera %s %s: loading %s on %s", spec.name, __version__, spec.model, address)

    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    try:
        loaded = await load()
    except Exception as error:  # reported in one line by the CLI (tessera.cli)
        # Stopped here, on the loop: a server left to the garbage collector prints a
        # traceback of its own once the loop is closed.
        await server.stop(0)
        if health_only is not None:
            await health_only[0].stop(0)
        raise StartupError(f"could not load {spec.model}: {one_line(error)}") from error
    await _set_health(health_servicer, spec.service_names, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "tessera %s %s ready: model=%s %s address=%s transport=%s health_address=%s "
        "torch_threads=%s",
        spec.name,
        __version__,
        spec.model,
        loaded,
        address,
        transport,
        health_address,
        _torch_threads(),
    )
    await stop.wait()
    log.info("tessera %s stopping: draining for up to %.1fs", spec.name, spec.drain_seconds)
    await _set_health(
        health_servicer, spec.service_names, health_pb2.HealthCheckResponse.NOT_SERVING
    )
    if drain is not None:
        await drain(spec.drain_seconds)
        await server.stop(_FLUSH_SECONDS)  # the calls it ended send their status
    else:
        await server.stop(spec.drain_seconds)
    if health_only is not None:
        # Stopped last: probes see NOT_SERVING, not a refused connection, while draining.
        await health_only[0].stop(0)
    log.info("tessera %s stopped", spec.name)


def _torch_threads() -> str:
    """torch's intra-op threads, for the ready line: with several services on one host
    (`tessera serve` splits its CPUs), an operator sees each one's share at a glance."""
    torch = sys.modules.get("torch")  # never imported here just to be named
    return str(torch.get_num_threads()) if torch is not None else "none"


async def _set_health(
    servicer: health.aio.HealthServicer, names: Sequence[str], status: int
) -> None:
    for name in ["", *names]:
        await servicer.set(name, status)


async def abort_unless_ready(context: grpc.aio.ServicerContext, ready: bool) -> None:
    if not ready:
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "the model is still loading; retry shortly"
        )
