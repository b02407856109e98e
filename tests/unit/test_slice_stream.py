"""The decoder's EmbeddingClient against real gRPC encoders on loopback that stream
scripted rows: exact rows from several messages, and a stream that is not exactly the
rows asked for is that encoder's fault, so the next encoder is asked."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import grpc
import pytest
import torch

from decoder_service.embedding_client import EmbeddingClient, FetchError
from decoder_service.request import MediaSource
from tessera.channels import ChannelPool
from tessera.placeholders import ChunkSlice, Modality, PlaceholderRange
from tessera.replicas import ReplicaSet
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
