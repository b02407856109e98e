"""One long-lived gRPC channel per peer address, shared by every call to it."""

from __future__ import annotations

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


class ChannelPool:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=[*GRPC_OPTIONS, *RECONNECT_OPTIONS]
            )
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
