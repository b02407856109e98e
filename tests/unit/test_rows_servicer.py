"""The encoder's GetEmbeddingRows over real gRPC on loopback: the rows of every slice in
request order, in messages of about --slice-message-bytes that span slices, readable by
plain protobuf; one dtype and width per call; and rows served from memory are views of
the cached item only when that keeps at most twice the bytes asked for alive."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from encoder_service.encoder import EncoderCore
from encoder_service.hash_trust import HashTrust
from encoder_service.items import RowRequest
from encoder_service.memory_store import MemoryStore
from encoder_service.servicer import CallLimits, EncoderServicer, add_to_server
from tessera.media_decoder import MediaLimits
from tessera.tensor_codec import encode_rows
from tessera.v1 import encoder_pb2, encoder_pb2_grpc
from tests.unit.test_encoder_core import HeldFamily

WIDTH = 8
ROW_BYTES = WIDTH * 4
ITEMS = {
    "a1" * 32: torch.arange(40 * WIDTH, dtype=torch.float32).view(40, WIDTH),
    "b2" * 32: -torch.arange(25 * WIDTH, dtype=torch.float32).view(25, WIDTH),
    "c3" * 32: torch.ones(6, WIDTH, dtype=torch.float16),
}


def encoder_core() -> EncoderCore:
    core = EncoderCore(HeldFamily(), MemoryStore(1 << 20), 8, 50.0, MediaLimits(10**6))
    for content_hash, rows in ITEMS.items():
        core.store.put(content_hash, encode_rows(rows))
    return core


def call(slices: list[tuple[str, int, int]], message_bytes: int):
    """The messages (parsed by protobuf) or the error, and the core's counters."""

    async def scenario():
        limits = CallLimits(1000, 10_000, 64, 1 << 20)
        servicer = EncoderServicer(limits, message_bytes, HashTrust())
        servicer.core = encoder_core()
        server = grpc.aio.server()
        add_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        request = encoder_pb2.GetEmbeddingSlicesRequest(
            slices=[encoder_pb2.RowSlice(content_hash=h, start=a, end=b) for h, a, b in slices]
        )
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = encoder_pb2_grpc.EncoderServiceStub(channel)
                try:
                    result = [m async for m in stub.GetEmbeddingRows(request, timeout=10)]
                except grpc.aio.AioRpcError as error:
                    result = error
        finally:
            await server.stop(None)
        return result, servicer.core.counters

    return asyncio.run(scenario())


A, B, C = ITEMS


@pytest.mark.parametrize("message_rows", [1, 3, 7, 16, 100])
def test_the_rows_of_every_slice_come_back_to_back_in_messages_across_slices(message_rows):
    slices = [(A, 5, 17), (B, 0, 25), (A, 30, 31), (A, 0, 40)]
    messages, counters = call(slices, message_rows * ROW_BYTES)
    expected = torch.cat([ITEMS[h][a:b] for h, a, b in slices])
    total = expected.shape[0]
    assert [m.first_row for m in messages] == list(range(0, total, message_rows))
    assert all(m.dtype == "float32" and m.row_width == WIDTH for m in messages)
    assert all(len(m.data) == min(message_rows, total - m.first_row) * ROW_BYTES for m in messages)
    rows = torch.frombuffer(bytearray(b"".join(m.data for m in messages)), dtype=torch.float32)
    assert torch.equal(rows.view(total, WIDTH), expected)
    assert counters.num_slice_calls == 1
    assert counters.num_bytes_served == total * ROW_BYTES


def test_a_message_is_at_least_one_row():
    messages, _ = call([(A, 0, 3)], 1)
    assert [len(m.data) for m in messages] == [ROW_BYTES] * 3


def test_slices_of_another_dtype_in_one_call_are_refused():
    error, counters = call([(A, 0, 2), (C, 0, 2)], 1 << 20)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "differ in dtype or width" in error.details()
    assert counters.num_bytes_served == 0
    messages, _ = call([(C, 0, 6)], 1 << 20)  # alone, served
    assert [m.dtype for m in messages] == ["float16"]


def test_an_unknown_item_refuses_the_call_before_any_row():
    error, counters = call([(A, 0, 2), ("d4" * 32, 0, 1)], 1 << 20)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert counters.num_bytes_served == 0 and counters.num_slice_misses == 1


def test_cached_rows_are_views_only_when_at_least_half_the_item():
    async def resolve():
        core = encoder_core()
        requests = [RowRequest(A, 0, 40), RowRequest(A, 10, 30), RowRequest(A, 10, 29)]
        return core.store.get(A, None), await core.resolve_slices(requests, None)

    item, (whole, half, less) = asyncio.run(resolve())
    assert whole is item  # the item itself
    assert isinstance(half.data, memoryview) and half.data.obj is item.data
    assert type(less.data) is bytes  # a copy: a view would keep 40 rows alive for 19
    assert bytes(half.data) == item.data[10 * ROW_BYTES : 30 * ROW_BYTES]
    assert less.data == item.data[10 * ROW_BYTES : 29 * ROW_BYTES]
