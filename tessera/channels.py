"""One long-lived gRPC channel per peer address, shared by every call to it."""

from __future__ import annotations

import asyncio
import time

import grpc

from tessera.server import GRPC_OPTIONS
from tessera.tls import TlsFiles, TlsWatch, channel_credentials, channel_options

# A peer that restarts is back within a second: gRPC's default reconnect backoff grows
# to two minutes, which kept failing requests for up to 20 s after a decoder reported
# SERVING again.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
DEFAULT_MAX_CHANNELS = 256
# How often `get` looks at the TLS files' stamps: a few stat calls a second at most,
# whatever the call rate.
TLS_RECHECK_SECONDS = 1.0
# A channel replaced after a certificate rotation closes once its calls end; calls still
# running this long after are cut (generation calls are bounded well below it).
ROTATED_GRACE_SECONDS = 600.0


class ChannelPoolFullError(RuntimeError):
    """A channel to one more peer than the pool's bound was asked for."""


class ChannelPool:
    """At most `max_channels` channels, one per address.

    The bound is a safety net, not a cache policy. Services dial only the replicas they
    discovered themselves (tessera.replicas.ReplicaSet), never an address a request
    names, and a replica that leaves DNS has its channel retired; so the pool holds one
    channel per live replica and reaches the bound only with a fleet (or a DNS name) far
    larger than intended. Past the bound `get` refuses a new address instead of evicting
    one: closing a channel aborts the calls on it, evicting safely would need a count of
    calls in flight per channel, and a silent churn of reconnects would hide the
    misconfiguration that an error names.

    With `tls`, channels are TLS and present the files' certificate. When the files change
    on disk (a rotation) every channel is replaced: new calls get a channel with the new
    certificate, and the old one closes once its calls end.
    """

    def __init__(
        self,
        max_channels: int = DEFAULT_MAX_CHANNELS,
        tls: TlsFiles | None = None,
        tls_recheck_seconds: float = TLS_RECHECK_SECONDS,
    ) -> None:
        if max_channels < 1:
            raise ValueError("max_channels must be >= 1")
        self.max_channels = max_channels
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._tls = TlsWatch(tls) if tls is not None and tls.enabled else None
        self._credentials = channel_credentials(self._tls.material) if self._tls else None
        self._tls_recheck_seconds = tls_recheck_seconds
        self._next_tls_check = time.monotonic() + tls_recheck_seconds
        # address -> the name its certificate must carry, when that is not the address:
        # replicas resolved from `dns:///name:port` are checked against `name`.
        self._server_names: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._channels)

    def __contains__(self, address: str) -> bool:
        return address in self._channels

    def set_server_name(self, address: str, name: str) -> None:
        """Check `address`'s certificate against `name` (a DNS name it was resolved from)
        instead of the address itself; takes effect on its next channel."""
        self._server_names[address] = name

    def get(self, address: str) -> grpc.aio.Channel:
        """The channel to `address`. Call it from the event loop, once per call (not
        once per process): a certificate rotation replaces the channels."""
        self._reload_tls()
        channel = self._channels.get(address)
        if channel is not None:
            return channel
        if len(self._channels) >= self.max_channels:
            raise ChannelPoolFullError(
                f"cannot dial {address}: already {self.max_channels} channels open, the most "
                "this process keeps (are there that many replicas?)"
            )
        channel = self._channels[address] = self._open(address)
        return channel

    def _open(self, address: str) -> grpc.aio.Channel:
        options = [*GRPC_OPTIONS, *RECONNECT_OPTIONS]
        if self._credentials is None:
            return grpc.aio.insecure_channel(address, options=options)
        options += channel_options(self._server_names.get(address))
        return grpc.aio.secure_channel(address, self._credentials, options=options)

    def _reload_tls(self) -> None:
        if self._tls is None or time.monotonic() < self._next_tls_check:
            return
        self._next_tls_check = time.monotonic() + self._tls_recheck_seconds
        material = self._tls.refresh()
        if material is None:
            return
        self._credentials = channel_credentials(material)
        for address in list(self._channels):
            self.retire(address, ROTATED_GRACE_SECONDS)

    def retire(self, address: str, grace_seconds: float) -> None:
        """Forgets `address`'s channel at once (it no longer counts against the bound) and
        closes it once its calls in flight end, or after `grace_seconds`. Call it from the
        event loop."""
        channel = self._channels.pop(address, None)
        if channel is None:
            return
        task = asyncio.get_running_loop().create_task(channel.close(grace_seconds))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Closes every channel at once (retired ones close on their own schedule)."""
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
