"""One long-lived gRPC channel per peer address, shared by every call to it."""

from __future__ import annotations

import asyncio

import grpc

from tessera.server import GRPC_OPTIONS

# A peer that restarts is back within a second: gRPC's default reconnect backoff grows
# to two minutes, which kept failing requests for up to 20 s after a decoder reported
# SERVING again.
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
DEFAULT_MAX_CHANNELS = 256


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
    """

    def __init__(self, max_channels: int = DEFAULT_MAX_CHANNELS) -> None:
        if max_channels < 1:
            raise ValueError("max_channels must be >= 1")
        self.max_channels = max_channels
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._channels)

    def __contains__(self, address: str) -> bool:
        return address in self._channels

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is not None:
            return channel
        if len(self._channels) >= self.max_channels:
            raise ChannelPoolFullError(
                f"cannot dial {address}: already {self.max_channels} channels open, the most "
                "this process keeps (are there that many replicas?)"
            )
        channel = self._channels[address] = grpc.aio.insecure_channel(
            address, options=[*GRPC_OPTIONS, *RECONNECT_OPTIONS]
        )
        return channel

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
