"""Embedding slices over gRPC against raw loopback TCP carrying the same bytes.

Five readers take the same number of bytes from another process on this machine:
- `grpc stream`: a plain gRPC client reading GetEmbeddingSlices from an encoder, each
  message parsed by protobuf (the per-slice protocol, and the decoder's fallback);
- `grpc rows stream`: a plain gRPC client reading the same slices with GetEmbeddingRows
  as bytes, finding each message's rows without copying them (nothing assembled);
- `decoder client`: the decoder's own EmbeddingClient, `fetch_chunk` of all the slices
  as one chunk (asyncio; one GetEmbeddingRows call, rows assembled into one buffer), one
  client and channel for every run, as a decoder keeps them;
- `decoder client, new channel`: the same with a new client, channel and event loop per
  run (how this suite measured it until 2026-12-05: connecting counts);
- `raw TCP`: a socket reading what a bare server process writes in 1 MiB sends.
Runs interleave (A B C D E A B C D E ...); the median of each is reported.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks.common import Progress, markdown_table
from decoder_service.embedding_client import EmbeddingClient
from decoder_service.request import MediaSource
from tessera.channels import ChannelPool
from tessera.hashing import model_fingerprint
from tessera.media import decode_image
from tessera.placeholders import ChunkSlice, Modality, PlaceholderRange
from tessera.replicas import ReplicaSet
from tessera.row_stream import decode_rows_message
from tessera.server import GRPC_OPTIONS
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

_SERVER = """
import socket, struct, sys
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen()
print(sock.getsockname()[1], flush=True)
block = bytes(range(256)) * 4096
while True:
    conn, _ = sock.accept()
    with conn:
        (size,) = struct.unpack("!Q", conn.recv(8, socket.MSG_WAITALL))
        while size > 0:
            part = block[: min(size, len(block))]
            conn.sendall(part)
            size -= len(part)
"""


@dataclass
class WireResult:
    num_bytes: int
    mib_per_s: dict[str, float]

    def ratios(self) -> dict[str, float]:
        raw = self.mib_per_s["raw TCP"]
        return {name: value / raw for name, value in self.mib_per_s.items()}


def _raw_tcp(port: int, num_bytes: int) -> float:
    buffer = bytearray(1 << 20)
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(num_bytes.to_bytes(8, "big"))
        received = 0
        while received < num_bytes:
            received += sock.recv_into(buffer)
    return time.perf_counter() - started


def _grpc_stream(stub, request: encoder_pb2.GetEmbeddingSlicesRequest, num_bytes: int) -> float:
    started = time.perf_counter()
    received = sum(len(m.rows.data) for m in stub.GetEmbeddingSlices(request, timeout=60))
    if received != num_bytes:
        raise RuntimeError(f"expected {num_bytes} bytes, got {received}")
    return time.perf_counter() - started


def _grpc_rows_stream(channel, request: encoder_pb2.GetEmbeddingSlicesRequest, num_bytes: int):
    get_rows = channel.unary_stream(
        "/tessera.v1.EncoderService/GetEmbeddingRows",
        request_serializer=encoder_pb2.GetEmbeddingSlicesRequest.SerializeToString,
    )
    started = time.perf_counter()
    received = sum(len(decode_rows_message(m)[1]) for m in get_rows(request, timeout=60))
    if received != num_bytes:
        raise RuntimeError(f"expected {num_bytes} bytes, got {received}")
    return time.perf_counter() - started


def _decoder_client(item: MediaSource, num_copies: int, hidden_size: int) -> float:
    """One fetch by a new client on a new channel (connection set-up included)."""
    client = _DecoderClient(item, num_copies, hidden_size)
    try:
        return client.run()
    finally:
        client.close()


class _DecoderClient:
    """The decoder's client as the decoder keeps it: one event loop and one channel for
    every fetch (the warm-up run connects)."""

    def __init__(self, item: MediaSource, num_copies: int, hidden_size: int):
        self.loop = asyncio.new_event_loop()
        # The decoder dials only encoders it discovered: here, the one the item names.
        self.pool = ChannelPool()
        encoders = ReplicaSet("encoder", item.encoder_addresses, self.pool)
        self.client = EmbeddingClient(encoders, hidden_size, 60_000, 60.0)
        self.items = [item] * num_copies
        whole = ChunkSlice(0, item.range.content_hash, 0, 0, item.range.length)
        self.slices = [whole] * num_copies

    def run(self) -> float:
        started = time.perf_counter()
        self.loop.run_until_complete(self.client.fetch_chunk("wire-bench", self.items, self.slices))
        return time.perf_counter() - started

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.close())
        self.loop.close()


def measure(
    encoder_address: str, model_dir: str, fingerprint: str | None, num_copies: int, repeats: int
) -> WireResult:
    """Streams one item's whole embedding `num_copies` times per run."""
    image = noise_image(424242, 224, 224)
    fingerprint = fingerprint or model_fingerprint(Path(model_dir))
    content_hash = decode_image(image).content_hash(fingerprint)
    channel = grpc.insecure_channel(encoder_address, options=GRPC_OPTIONS)
    stub = encoder_pb2_grpc.EncoderServiceStub(channel)
    encoded = stub.Encode(
        encoder_pb2.EncodeRequest(
            items=[
                common_pb2.MediaItem(
                    modality=common_pb2.MODALITY_IMAGE, data=image, content_hash=content_hash
                )
            ]
        ),
        timeout=60,
    ).items[0]
    rows, hidden = encoded.num_rows, encoded.hidden_size
    num_bytes = rows * hidden * 4 * num_copies
    request = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=0, end=rows)] * num_copies
    )
    item = MediaSource(
        PlaceholderRange(Modality.IMAGE, content_hash, 0, rows), (encoder_address,), image
    )
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    kept = _DecoderClient(item, num_copies, hidden)
    try:
        port = int(server.stdout.readline())
        runs = {
            "grpc stream": lambda: _grpc_stream(stub, request, num_bytes),
            "grpc rows stream": lambda: _grpc_rows_stream(channel, request, num_bytes),
            "decoder client": kept.run,
            "decoder client, new channel": lambda: _decoder_client(item, num_copies, hidden),
            "raw TCP": lambda: _raw_tcp(port, num_bytes),
        }
        for run in runs.values():
            run()  # warm-up
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        progress = Progress(repeats * len(runs), "wire")
        for _ in range(repeats):
            for name, run in runs.items():
                seconds[name].append(run())
                progress.advance()
    finally:
        kept.close()
        server.kill()
        server.wait()
        channel.close()
    return WireResult(
        num_bytes,
        {name: num_bytes / 2**20 / statistics.median(s) for name, s in seconds.items()},
    )


def table(result: WireResult) -> str:
    ratios = result.ratios()
    return markdown_table(
        ["reader", "MiB/s (median)", "vs raw TCP"],
        [[name, speed, ratios[name]] for name, speed in result.mib_per_s.items()],
    )
