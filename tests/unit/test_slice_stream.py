"""The decoder's EmbeddingClient against real gRPC encoders on loopback that stream
scripted rows: exact rows from several messages, and a stream that is not exactly the
rows asked for is that encoder's fault, so the next encoder is asked. A chunk's slices
come in one GetEmbeddingRows call; a bad batch, or an encoder without that method, is
asked slice by slice."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import grpc
import pytest
import torch

from decoder_service import embedding_client
from decoder_service.embedding_client import EmbeddingClient, FetchError
from decoder_service.request import MediaSource
from encoder_service.servicer import add_to_server
from tessera.channels import ChannelPool
from tessera.placeholders import ChunkSlice, Modality, PlaceholderRange
from tessera.replicas import ReplicaSet
from tessera.row_stream import encode_rows_message
from tessera.tensor_codec import encode_rows
from tessera.v1 import encoder_pb2, encoder_pb2_grpc
from tessera.wire import fill_block_proto

HASH = "5e" * 32
WIDTH = 8
ITEM = torch.arange(40 * WIDTH, dtype=torch.float32).view(40, WIDTH)  # the item's rows

# (rows asked for [start, end)) -> (first row, rows) of each message to send
Script = Callable[[int, int], list[tuple[int, torch.Tensor]]]


def in_messages_of(size: int) -> Script:
    return lambda start, end: [
        (at, ITEM[at : min(at + size, end)]) for at in range(start, end, size)
    ]


def one_row_short(start: int, end: int) -> list[tuple[int, torch.Tensor]]:
    return in_messages_of(3)(start, end - 1)


def one_row_over(start: int, end: int) -> list[tuple[int, torch.Tensor]]:
    return [(start, ITEM[start : end + 1])]


def too_wide(start: int, end: int) -> list[tuple[int, torch.Tensor]]:
    return [(start, ITEM[start:end].repeat(1, 2))]


class ScriptedEncoder(encoder_pb2_grpc.EncoderServiceServicer):
    def __init__(self, script: Script):
        self.script = script
        self.num_calls = 0

    async def GetEmbeddingSlices(self, request, context):
        self.num_calls += 1
        (asked,) = request.slices
        for start, rows in self.script(asked.start, asked.end):
            out = encoder_pb2.EmbeddingSlice(content_hash=asked.content_hash, start=start)
            fill_block_proto(out.rows, encode_rows(rows))
            yield out


async def serve(servicer: ScriptedEncoder) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    encoder_pb2_grpc.add_EncoderServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def fetch(scripts: list[Script], row_start: int, row_end: int):
    """Fetches rows [row_start, row_end) of the item from encoders running `scripts`, asked
    in that order; returns the rows (or the error), the client and the servicers."""

    async def scenario():
        servicers = [ScriptedEncoder(script) for script in scripts]
        servers = [await serve(s) for s in servicers]
        addresses = [address for _, address in servers]
        pool = ChannelPool()
        client = EmbeddingClient(ReplicaSet("encoder", addresses, pool), WIDTH, 60_000, 60.0)
        item = MediaSource(PlaceholderRange(Modality.IMAGE, HASH, 0, 40), tuple(addresses), b"")
        try:
            result = await client.fetch_slice(
                "request-1", item, ChunkSlice(0, HASH, 0, row_start, row_end)
            )
        except FetchError as error:
            result = error
        finally:
            await pool.close()
            for server, _ in servers:
                await server.stop(None)
        return result, client, servicers

    return asyncio.run(scenario())


@pytest.mark.parametrize("size", [1, 3, 7, 30])
def test_rows_streamed_in_messages_of_any_size_are_exactly_the_rows_asked_for(size):
    fetched, client, _ = fetch([in_messages_of(size)], 5, 35)
    assert torch.equal(fetched.rows, ITEM[5:35])
    assert fetched.num_bytes == client.num_bytes_received == 30 * WIDTH * 4


@pytest.mark.parametrize("bad", [one_row_short, one_row_over, too_wide])
def test_a_bad_stream_is_that_encoders_fault_and_the_next_is_asked(bad):
    fetched, _, servicers = fetch([bad, in_messages_of(4)], 5, 35)
    assert torch.equal(fetched.rows, ITEM[5:35])
    assert [s.num_calls for s in servicers] == [1, 1]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (one_row_short, r"rows \[5, 34\) .* expected up to 35"),
        (one_row_over, "below row 35"),
        (too_wide, "expected rows 8 wide"),
    ],
)
def test_when_every_encoder_streams_badly_the_fetch_fails_saying_why(bad, reason):
    error, _, servicers = fetch([bad, bad], 5, 35)
    assert isinstance(error, FetchError)
    assert str(error).count("127.0.0.1:") == 2
    assert str(error).startswith(f"no encoder could provide item {HASH}")
    assert re.search(reason, str(error))
    assert [s.num_calls for s in servicers] == [1, 1]


# fetch_chunk: a chunk's slices on one encoder in one GetEmbeddingRows call.

CHUNK_SLICES = [
    ChunkSlice(0, HASH, 0, 5, 17),
    ChunkSlice(1, HASH, 0, 0, 3),
    ChunkSlice(2, HASH, 0, 20, 40),
]
CHUNK_ROWS = [ITEM[s.row_start : s.row_end] for s in CHUNK_SLICES]

# (rows of the call, in request order) -> serialized EmbeddingRows messages
RowsScript = Callable[[torch.Tensor], list[bytes]]


def rows_in_messages_of(size: int) -> RowsScript:
    def script(rows: torch.Tensor) -> list[bytes]:
        return [
            encode_rows_message(at, "float32", WIDTH, [encode_rows(rows[at : at + size]).data])
            for at in range(0, rows.shape[0], size)
        ]

    return script


def rows_one_short(rows: torch.Tensor) -> list[bytes]:
    return rows_in_messages_of(5)(rows[:-1])


def rows_skipping_one(rows: torch.Tensor) -> list[bytes]:
    first, *rest = rows_in_messages_of(5)(rows)
    return [first, *rest[1:]]


class CallCounter(grpc.aio.ServerInterceptor):
    """Every call that reaches the server, by method, whether or not it has a handler."""

    def __init__(self):
        self.calls: dict[str, int] = {}

    async def intercept_service(self, continuation, details):
        method = details.method.rsplit("/", 1)[-1]
        self.calls[method] = self.calls.get(method, 0) + 1
        return await continuation(details)


class RowsEncoder(ScriptedEncoder):
    def __init__(self, rows_script: RowsScript):
        super().__init__(in_messages_of(4))
        self.rows_script = rows_script

    async def GetEmbeddingRows(self, request, context):
        rows = torch.cat([ITEM[s.start : s.end] for s in request.slices])
        for message in self.rows_script(rows):
            yield message


async def serve_counted(servicer, with_rows: bool) -> tuple[grpc.aio.Server, str, CallCounter]:
    """`with_rows=False`: an encoder from before GetEmbeddingRows (no handler for it)."""
    counter = CallCounter()
    server = grpc.aio.server(interceptors=[counter])
    if with_rows:
        add_to_server(servicer, server)
    else:
        slices = grpc.unary_stream_rpc_method_handler(
            servicer.GetEmbeddingSlices,
            request_deserializer=encoder_pb2.GetEmbeddingSlicesRequest.FromString,
            response_serializer=encoder_pb2.EmbeddingSlice.SerializeToString,
        )
        handlers = {"GetEmbeddingSlices": slices}
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("tessera.v1.EncoderService", handlers),)
        )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}", counter


def fetch_chunks(servicer, with_rows: bool, times: int = 1):
    """fetch_chunk of CHUNK_SLICES `times` over; returns each fetch's rows, the client's
    byte count and the calls the encoder saw."""

    async def scenario():
        server, address, counter = await serve_counted(servicer, with_rows)
        pool = ChannelPool()
        client = EmbeddingClient(ReplicaSet("encoder", [address], pool), WIDTH, 60_000, 60.0)
        item = MediaSource(PlaceholderRange(Modality.IMAGE, HASH, 0, 40), (address,), b"")
        try:
            fetches = [
                await client.fetch_chunk("request-1", [item] * 3, CHUNK_SLICES)
                for _ in range(times)
            ]
        finally:
            await pool.close()
            await server.stop(None)
        return fetches, client.num_bytes_received, counter.calls

    return asyncio.run(scenario())


@pytest.mark.parametrize("size", [1, 4, 12, 35])
def test_a_chunks_slices_come_in_one_call_in_messages_across_slices(size):
    (fetched,), num_bytes, calls = fetch_chunks(RowsEncoder(rows_in_messages_of(size)), True)
    assert calls == {"GetEmbeddingRows": 1}
    assert [f.slice for f in fetched] == CHUNK_SLICES
    for rows, expected in zip(fetched, CHUNK_ROWS, strict=True):
        assert torch.equal(rows.rows, expected)
        assert rows.num_bytes == expected.numel() * 4 and not rows.reencoded
    assert num_bytes == sum(r.numel() for r in CHUNK_ROWS) * 4


@pytest.mark.parametrize("bad", [rows_one_short, rows_skipping_one])
def test_a_bad_batch_is_fetched_again_slice_by_slice(bad):
    (fetched,), _, calls = fetch_chunks(RowsEncoder(bad), True)
    assert calls == {"GetEmbeddingRows": 1, "GetEmbeddingSlices": 3}
    for rows, expected in zip(fetched, CHUNK_ROWS, strict=True):
        assert torch.equal(rows.rows, expected)


def test_an_encoder_without_get_embedding_rows_is_asked_slice_by_slice_for_a_while(
    monkeypatch,
):
    servicer = ScriptedEncoder(in_messages_of(4))
    fetches, _, calls = fetch_chunks(servicer, False, times=3)
    # Asked once; UNIMPLEMENTED is remembered, so the next chunks go slice by slice.
    assert calls == {"GetEmbeddingRows": 1, "GetEmbeddingSlices": 9}
    for fetched in fetches:
        for rows, expected in zip(fetched, CHUNK_ROWS, strict=True):
            assert torch.equal(rows.rows, expected)
    monkeypatch.setattr(embedding_client, "ROWS_UNIMPLEMENTED_SECONDS", 0.0)
    _, _, calls = fetch_chunks(servicer, False, times=2)
    assert calls == {"GetEmbeddingRows": 2, "GetEmbeddingSlices": 6}
