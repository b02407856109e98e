"""A chunk's slices on one encoder come in one GetEmbeddingRows call, through the real
encoder process: exactly the rows asked for, the same rows GetEmbeddingSlices serves, and
an item the encoder does not have costs only that item's encoding, every other item's
rows still sent exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import torch

from decoder_service.embedding_client import EmbeddingClient
from decoder_service.request import MediaSource
from tessera.channels import ChannelPool
from tessera.client import Client, Message
from tessera.hashing import model_fingerprint
from tessera.media import decode_image
from tessera.placeholders import ChunkSlice, Modality, PlaceholderRange
from tessera.replicas import ReplicaSet
from tessera.tensor_codec import decode_rows
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc


@pytest.fixture(scope="module")
def encoder(cluster):
    with grpc.insecure_channel(cluster.address("encoder")) as channel:
        yield encoder_pb2_grpc.EncoderServiceStub(channel)


def stats(encoder) -> encoder_pb2.EncoderStats:
    return encoder.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=30)


def media_item(demo_model_dir: Path, seed: int) -> tuple[str, bytes]:
    image = noise_image(seed, 40 + seed % 7, 30 + seed % 5)
    return decode_image(image).content_hash(model_fingerprint(demo_model_dir)), image


def encode(encoder, content_hash: str, image: bytes) -> encoder_pb2.EncodedItem:
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE, data=image, content_hash=content_hash
    )
    return encoder.Encode(encoder_pb2.EncodeRequest(items=[item]), timeout=60).items[0]


def rows_one_by_one(encoder, content_hash: str, start: int, end: int) -> torch.Tensor:
    """The rows as GetEmbeddingSlices serves them, read with plain protobuf."""
    request = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=start, end=end)]
    )
    messages = list(encoder.GetEmbeddingSlices(request, timeout=30))
    return torch.cat([decode_rows(m.rows.dtype, list(m.rows.shape), m.rows.data) for m in messages])


def fetch_chunk(address: str, row_width: int, items: list[MediaSource], slices):
    async def fetch():
        pool = ChannelPool()
        client = EmbeddingClient(ReplicaSet("encoder", [address], pool), row_width, 60_000, 60.0)
        try:
            fetched = await client.fetch_chunk("batched-fetch", items, slices)
        finally:
            await pool.close()
        return fetched, client.num_bytes_received

    return asyncio.run(fetch())


def test_one_call_for_a_chunks_items_exact_rows_and_a_missing_item_alone_recomputed(
    cluster, encoder, demo_model_dir
):
    address = cluster.address("encoder")
    (hash_a, image_a), (hash_b, image_b), (hash_c, image_c) = (
        media_item(demo_model_dir, seed) for seed in (301, 302, 303)
    )
    encoded_a, encoded_b = encode(encoder, hash_a, image_a), encode(encoder, hash_b, image_b)
    num_rows, width = encoded_a.num_rows, encoded_a.hidden_size
    assert encoded_b.num_rows == num_rows > 9
    middle = num_rows // 2 + 1

    def source(content_hash: str, image: bytes) -> MediaSource:
        return MediaSource(
            PlaceholderRange(Modality.IMAGE, content_hash, 0, num_rows), (address,), image
        )

    # Several slices of each item, as a chunk cutting through them would have (a video
    # has one range per temporal step), in an order that is not the items'.
    items = [source(hash_a, image_a), source(hash_b, image_b), source(hash_c, image_c)]
    wanted = [(0, 3, middle), (1, 0, num_rows), (0, middle, num_rows), (2, 5, 9)]
    slices = [ChunkSlice(i, items[i].range.content_hash, 0, start, end) for i, start, end in wanted]
    row_bytes = width * 4
    minimum = sum(end - start for _, start, end in wanted) * row_bytes

    # All present: one call, exactly the rows asked for, the rows the encoder serves.
    before = stats(encoder)
    fetched, received = fetch_chunk(address, width, items, slices[:3])
    after = stats(encoder)
    assert after.num_slice_calls - before.num_slice_calls == 1
    assert after.num_items_computed == before.num_items_computed
    assert received == after.num_bytes_served - before.num_bytes_served
    assert received == minimum - 4 * row_bytes
    for (i, start, end), rows in zip(wanted[:3], fetched, strict=True):
        assert rows.num_bytes == (end - start) * row_bytes and not rows.reencoded
        expected = rows_one_by_one(encoder, items[i].range.content_hash, start, end)
        assert torch.equal(rows.rows, expected)

    # Item C was never encoded here: the call is refused before it sends a row, every
    # slice is asked for on its own, and only C is encoded (from the bytes the decoder
    # holds) and asked for again.
    before = stats(encoder)
    fetched, received = fetch_chunk(address, width, items, slices)
    after = stats(encoder)
    assert after.num_items_computed - before.num_items_computed == 1
    assert after.num_slice_calls - before.num_slice_calls == 1 + len(slices) + 1
    assert after.num_slice_misses - before.num_slice_misses == 2  # the batch's, C's own
    assert received == minimum == after.num_bytes_served - before.num_bytes_served
    assert [rows.reencoded for rows in fetched] == [False, False, False, True]
    for (i, start, end), rows in zip(wanted, fetched, strict=True):
        expected = rows_one_by_one(encoder, items[i].range.content_hash, start, end)
        assert torch.equal(rows.rows, expected)


def test_two_images_in_one_chunk_come_in_one_call_end_to_end(cluster, encoder, reference):
    """Through gateway and decoder. The images are encoded first, by a request of other
    text, so that the decoder's call finds them (an item still in flight on the
    gateway's Encode sends the batch down the slice-by-slice path)."""
    images = [noise_image(311, 48, 40), "and", noise_image(312, 36, 52)]
    warm = [Message("user", ["Look:", *images, "which is brighter?"])]
    prompt = [("user", ["Now compare:", *images, "which is darker?"])]
    expected = reference.generate(prompt, 8)
    sampling = common_pb2.SamplingParams(max_tokens=8, temperature=0.0)
    with Client(cluster.address("gateway")) as client:
        client.complete(warm, sampling, cache_salt="one-call")
        before = stats(encoder)
        done = client.complete([Message(r, p) for r, p in prompt], sampling, cache_salt="one-call")
    after = stats(encoder)
    assert_greedy_match(done.token_ids, expected)
    (chunk,) = [c for c in done.stats.decoder.chunks if c.num_embedding_rows]
    image_rows = done.prompt_token_ids.count(reference.placeholder_token_id)
    assert chunk.num_embedding_rows == image_rows
    assert chunk.num_embedding_bytes == image_rows * reference.row_bytes
    assert after.num_slice_calls - before.num_slice_calls == 1
    assert after.num_items_computed == before.num_items_computed
