"""A caller who pins all it can: leases are bounded in all and per owner, so the encoder
stays within its cache budget and keeps taking other callers' items."""

from __future__ import annotations

import grpc
import pytest

from tessera.media import decode_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc
from tests.cluster import Cluster
from tests.reference import noise_image

NUM_HOSTILE_ITEMS = 24
CACHE_ITEMS = 8  # the encoder's cache holds this many items


def image_item(fingerprint: str, seed: int) -> common_pb2.MediaItem:
    data = noise_image(1000 + seed, 24, 24)
    return common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=data,
        content_hash=decode_image(data).content_hash(fingerprint),
    )


@pytest.fixture(scope="module")
def item_bytes(cluster) -> int:
    """Bytes of one demo image's rows, from the session encoder."""
    with grpc.insecure_channel(cluster.address("encoder")) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        request = encoder_pb2.EncodeRequest(items=[image_item(cluster.fingerprint(), 0)])
        encoded = stub.Encode(request, timeout=60).items[0]
    assert encoded.dtype == "float32", encoded.dtype  # the demo model on CPU
    return encoded.num_rows * encoded.hidden_size * 4


@pytest.fixture(scope="module")
def small_encoder(demo_model_dir, item_bytes):
    """An encoder whose cache holds CACHE_ITEMS items: 2 may be pinned per owner."""
    own = Cluster()
    cache_bytes = CACHE_ITEMS * item_bytes
    own.start(
        "encoder",
        "encoder",
        [
            "--model",
            str(demo_model_dir),
            "--cache-bytes",
            str(cache_bytes),
            "--max-pinned-bytes-per-owner",
            str(2 * item_bytes),
        ],
    )
    try:
        own.wait_ready()
        with grpc.insecure_channel(own.address("encoder")) as channel:
            yield encoder_pb2_grpc.EncoderServiceStub(channel)
    finally:
        own.stop()


def stats(stub) -> encoder_pb2.EncoderStats:
    return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def test_a_caller_pinning_everything_cannot_hold_the_cache(cluster, small_encoder, item_bytes):
    fingerprint = cluster.fingerprint()
    hostile = [image_item(fingerprint, seed) for seed in range(1, NUM_HOSTILE_ITEMS + 1)]
    for item in hostile:  # one call per item: as many calls as it likes, the longest lease
        request = encoder_pb2.EncodeRequest(items=[item], lease_owner="hostile", lease_ms=300_000)
        small_encoder.Encode(request, timeout=60)
    held = stats(small_encoder)
    # Before the bounds every one of the 24 items stayed pinned: 3x the cache budget.
    assert held.num_cached_bytes <= CACHE_ITEMS * item_bytes
    assert held.num_pinned_bytes == 2 * item_bytes
    assert held.num_pins_refused == NUM_HOSTILE_ITEMS - 2

    # Another caller's items are taken, pinned and kept while its lease lives.
    mine = [image_item(fingerprint, seed) for seed in range(100, 102)]
    request = encoder_pb2.EncodeRequest(items=mine, lease_owner="victim", lease_ms=60_000)
    small_encoder.Encode(request, timeout=60)
    for item in hostile[:CACHE_ITEMS]:  # more hostile traffic after it
        small_encoder.Encode(encoder_pb2.EncodeRequest(items=[item]), timeout=60)
    again = small_encoder.Encode(encoder_pb2.EncodeRequest(items=mine), timeout=60)
    assert [item.source for item in again.items] == [encoder_pb2.ENCODE_SOURCE_MEMORY] * 2
    after = stats(small_encoder)
    assert after.num_cached_bytes <= CACHE_ITEMS * item_bytes
    assert after.num_pinned_bytes == 4 * item_bytes
