"""The live replicas of one service, from a static list or from DNS.

Targets are `host:port` or `dns:///name:port`; the latter resolves to every address of
the name (a headless Kubernetes Service lists one per pod) and is resolved again every
`refresh_seconds`. A replica that fails a call or a health check is set aside for
`retry_seconds`, then tried again; when every replica is set aside, all are offered
(a request is better tried than refused).

The set is also what a process may dial: `channel(address)` refuses any address the set
does not hold, and the channel of a replica that leaves DNS is retired from the pool, so
the pool stays about as large as the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tessera.channels import ChannelPool

log = logging.getLogger("tessera.replicas")

DNS_PREFIX = "dns:///"
# How long calls in flight to a replica that left DNS may go on before its channel is
# closed under them. A replica leaves when its pod stops being ready (it drains, or is
# gone), and its own drain (--drain-seconds) ends its calls well before this; the
# channel closes as soon as they end.
RETIRE_GRACE_SECONDS = 600.0


class UnknownReplicaError(LookupError):
    """An address that is not one of the set's replicas: it is never dialed."""


def split_host_port(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{target!r} is not host:port")
    return host.strip("[]"), int(port)


def on_this_host(target: str) -> bool:
    """Whether a target names this host: a loopback or unspecified address, or localhost.
    Any other name, `dns:///` ones included, is taken to be elsewhere.

    "127.0.0.1:50052", "[::1]:50052", "localhost:50052", "0.0.0.0:50052" -> True
    "10.0.0.7:50052", "dns:///tessera-encoder:50052"                     -> False
    """
    host, _ = split_host_port(target.removeprefix(DNS_PREFIX))
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


async def resolve(target: str) -> list[str]:
    """`dns:///name:port` -> every `ip:port` of the name; anything else as it is."""
    if not target.startswith(DNS_PREFIX):
        return [target]
    host, port = split_host_port(target[len(DNS_PREFIX) :])
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = []
    for family, _, _, _, sockaddr in infos:
        address = (
            f"[{sockaddr[0]}]:{port}" if family == socket.AF_INET6 else f"{sockaddr[0]}:{port}"
        )
        if address not in addresses:
            addresses.append(address)
    return addresses


class ReplicaSet:
    def __init__(
        self,
        name: str,
        targets: Sequence[str],
        channels: ChannelPool,
        refresh_seconds: float = 10.0,
        retry_seconds: float = 5.0,
    ):
        self.name = name
        self.targets = list(targets)
        self.channels = channels
        self.refresh_seconds = refresh_seconds
        self.retry_seconds = retry_seconds
        self._addresses: list[str] = [t for t in targets if not t.startswith(DNS_PREFIX)]
        self._down_until: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._maintain(), name=f"{self.name}-replicas")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to one of the set's replicas; any other address raises
        UnknownReplicaError. Callers filter addresses against `addresses` first: this is
        the guarantee that an address from a request is never dialed, and it also catches
        a replica that left the set while a caller was still going down its list."""
        if address not in self._addresses:
            raise UnknownReplicaError(f"{address} is not a discovered {self.name}")
        return self.channels.get(address)

    def live(self) -> list[str]:
        """Replicas not set aside; every replica if all are."""
        now = time.monotonic()
        up = [a for a in self._addresses if self._down_until.get(a, 0) <= now]
        return up or list(self._addresses)

    def mark_down(self, address: str, reason: str) -> None:
        if self._down_until.get(address, 0) <= time.monotonic():
            log.warning(
                "%s %s set aside for %.0fs: %s", self.name, address, self.retry_seconds, reason
            )
        self._down_until[address] = time.monotonic() + self.retry_seconds

    def mark_up(self, address: str) -> None:
        self._down_until.pop(address, None)

    async def refresh(self) -> None:
        addresses: list[str] = []
        for target in self.targets:
            try:
                resolved = await resolve(target)
            except OSError as error:
                log.warning("cannot resolve %s: %s", target, error)
                continue
            addresses += [a for a in resolved if a not in addresses]
            if target.startswith(DNS_PREFIX):
                # A pod's address is in no certificate; the name it was found under is.
                name = split_host_port(target[len(DNS_PREFIX) :])[0]
                for address in resolved:
                    self.channels.set_server_name(address, name)
        if addresses and addresses != self._addresses:
            log.info("%s replicas: %s", self.name, ", ".join(addresses))
            for gone in set(self._addresses) - set(addresses):
                self.channels.retire(gone, RETIRE_GRACE_SECONDS)
                self._down_until.pop(gone, None)
            self._addresses = addresses

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_seconds)
            try:
                await self.refresh()
                await asyncio.gather(*(self._probe(a) for a in self._addresses))
            except Exception:  # e.g. ChannelPoolFullError: keep discovering, say why
                log.exception("refreshing the %s replicas failed", self.name)

    async def _probe(self, address: str) -> None:
        stub = health_pb2_grpc.HealthStub(self.channels.get(address))
        try:
            response = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.aio.AioRpcError as error:
            self.mark_down(address, f"health check: {error.code().name}")
            return
        if response.status == health_pb2.HealthCheckResponse.SERVING:
            self.mark_up(address)
        else:
            self.mark_down(address, "health check: not serving")
