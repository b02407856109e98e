"""The gateway hears an encoder's announcement (the items are in flight) while the
encode is still running, over real gRPC on loopback against the encoder's servicer: a
decode request waiting for it goes out then, not when the rows are done."""

from __future__ import annotations

import asyncio

import grpc

from encoder_service.hash_trust import HashTrust
from encoder_service.servicer import CallLimits, EncoderServicer, add_to_server
from tessera.encode_call import encode_announced
from tessera.v1 import common_pb2, encoder_pb2
from tests.unit.test_encoder_core import HeldFamily, core, item


def encode_request(seeds: list[int]) -> encoder_pb2.EncodeRequest:
    items = [item(seed) for seed in seeds]
    return encoder_pb2.EncodeRequest(
        items=[
            common_pb2.MediaItem(
                modality=common_pb2.MODALITY_IMAGE, data=i.data, content_hash=i.content_hash
            )
            for i in items
        ]
    )


async def serving(family: HeldFamily) -> tuple[grpc.aio.Server, str]:
    servicer = EncoderServicer(CallLimits(1000, 10_000, 64, 1 << 20), 1 << 20, HashTrust())
    servicer.core = core(family)
    server = grpc.aio.server()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_the_announcement_arrives_while_the_encode_is_held():
    async def scenario() -> None:
        family = HeldFamily()  # encodes nothing until released
        server, address = await serving(family)
        announced = asyncio.Event()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                call = asyncio.create_task(
                    encode_announced(channel, encode_request([1, 2]), 30, announced.set)
                )
                # Before the fix the announcement came with the response, which needs
                # the release below: this wait then failed instead of returning.
                await asyncio.wait_for(announced.wait(), 30)
                assert not call.done()
                assert family.batches == []
                family.release.set()
                response = await call
        finally:
            await server.stop(None)
        assert [i.source for i in response.items] == [encoder_pb2.ENCODE_SOURCE_COMPUTED] * 2
        assert [i.num_rows for i in response.items] == [4, 4]

    asyncio.run(scenario())


def test_a_refused_encode_raises_as_a_unary_call_would_and_announces_nothing():
    async def scenario() -> None:
        family = HeldFamily()
        family.release.set()
        server, address = await serving(family)
        request = encode_request([3])
        request.items[0].content_hash = "not a hash"
        announced: list[bool] = []
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                try:
                    await encode_announced(channel, request, 30, lambda: announced.append(True))
                except grpc.aio.AioRpcError as error:
                    refused = error
        finally:
            await server.stop(None)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not a content hash" in refused.details()
        assert announced == []

    asyncio.run(scenario())
