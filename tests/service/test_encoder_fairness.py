"""A caller who takes all it can from an encoder: its pins are bounded in all and per
owner, so the encoder stays within its cache budget and keeps taking other callers'
items; its huge images run one batch at a time, with other callers' items between."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tessera.media import decode_image
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc
from tests.direct import image_decode_request

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
def own(demo_model_dir, item_bytes):
    """ "encoder": its cache holds CACHE_ITEMS items, 2 of them pinned per owner;
    "forgetful": its cache holds nothing and it grants no pins; a decoder that knows
    only "forgetful"."""
    own = Cluster()
    model = ["--model", str(demo_model_dir)]
    own.start(
        "encoder",
        "encoder",
        [
            *model,
            "--cache-bytes",
            str(CACHE_ITEMS * item_bytes),
            "--max-pinned-bytes-per-owner",
            str(2 * item_bytes),
            # Requests of many huge images pass, to show how they share the model.
            "--max-request-pixels",
            str(10**9),
        ],
    )
    forgetful = own.start("forgetful", "encoder", [*model, "--cache-bytes", "0"])
    own.start(
        "decoder", "decoder", [*model, "--encoders", forgetful, "--kv-cache-bytes", "8388608"]
    )
    try:
        own.wait_ready()
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="module")
def small_encoder(own):
    with grpc.insecure_channel(own.address("encoder")) as channel:
        yield encoder_pb2_grpc.EncoderServiceStub(channel)


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


def flat_png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_small_image_does_not_wait_for_a_request_of_huge_ones(cluster, small_encoder):
    """5 images of 20 M pixels in one call (each a batch of its own under the 16 M-pixel
    batch bound) and, once the first of them runs, a one-image call from someone else:
    it is served between two of the huge ones. FIFO put it behind all five."""
    fingerprint = cluster.fingerprint()
    huge = []
    for index in range(5):
        data = flat_png(4500, 4500 + index)
        content_hash = decode_image(data).content_hash(fingerprint)
        huge.append(
            common_pb2.MediaItem(
                modality=common_pb2.MODALITY_IMAGE, data=data, content_hash=content_hash
            )
        )
    before = stats(small_encoder).num_batches
    with ThreadPoolExecutor(1) as pool:
        big_call = pool.submit(
            small_encoder.Encode, encoder_pb2.EncodeRequest(items=huge), timeout=300
        )
        while stats(small_encoder).num_batches == before:  # the first huge image runs
            assert not big_call.done(), big_call.result()
            time.sleep(0.01)  # only to poll less often: nothing waits on the time
        small = encoder_pb2.EncodeRequest(items=[image_item(fingerprint, 500)])
        assert small_encoder.Encode(small, timeout=300).items[0].num_rows > 0
        # Served while the huge call still had images to go.
        assert not big_call.done()
        assert len(big_call.result().items) == 5


def test_an_item_lost_right_after_encoding_is_the_encoders_trouble(own, cluster, reference):
    """An encoder that cannot keep an item until it is read (no cache, no pins) fails the
    fetch as the encoders' trouble (FAILED_PRECONDITION, a 503 at the gateway), not as a
    bad item (it said INVALID_ARGUMENT "Encode it first" before)."""
    image = noise_image(2024, 30, 30)
    prompt = reference.inputs([("user", [image, "What is shown?"])])["input_ids"][0].tolist()
    content_hash = decode_image(image).content_hash(cluster.fingerprint())
    request = image_decode_request(
        prompt, reference.placeholder_token_id, image, content_hash, "forgotten", max_tokens=2
    )
    with grpc.insecure_channel(own.address("decoder")) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Generate(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value.details()
    assert "evicted right after encoding" in caught.value.details()
