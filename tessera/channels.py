"""One long-lived gRPC channel per peer address, shared by every call to it."""

from __future__ import annotations

import grpc

from tessera.server import GRPC_OPTIONS


class ChannelPool:
    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=GRPC_OPTIONS
            )
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
