"""Nothing is lost: an item an encoder never saw or evicted is encoded again from the
bytes the decode request carries, and the output stays exact. (A dead encoder routed
around: test_decoder_discovery.py, since a decoder dials only encoders it discovered.)"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tessera.media import decode_image
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import (
    common_pb2,
    decoder_pb2,
    decoder_pb2_grpc,
    encoder_pb2,
    encoder_pb2_grpc,
)
from tests.direct import image_decode_request

MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def fingerprint(cluster) -> str:
    return cluster.fingerprint()


def direct_request(reference, fingerprint, image: bytes, encoders: list[str], request_id: str):
    """A decode request built by hand, as the gateway would, for one image."""
    messages = [("user", [image, "What is shown?"])]
    prompt = reference.inputs(messages)["input_ids"][0].tolist()
    content_hash = decode_image(image).content_hash(fingerprint)
    request = image_decode_request(
        prompt,
        reference.placeholder_token_id,
        image,
        content_hash,
        request_id,
        encoders,
        max_tokens=MAX_NEW_TOKENS,
    )
    return request, messages


def run_decoder(cluster, request) -> tuple[list[int], decoder_pb2.DecodeFinished]:
    with grpc.insecure_channel(cluster.address("decoder")) as channel:
        responses = list(decoder_pb2_grpc.DecoderServiceStub(channel).Generate(request, timeout=60))
    tokens = [t for r in responses if r.HasField("tokens") for t in r.tokens.token_ids]
    return tokens, responses[-1].finished


def stats(cluster, name: str) -> encoder_pb2.EncoderStats:
    with grpc.insecure_channel(cluster.address(name)) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def test_slice_request_before_encode_is_recovered(cluster, reference, fingerprint):
    """The race: the decoder asks for rows of an item the encoder has never seen."""
    image = noise_image(301, 36, 36)
    request, messages = direct_request(
        reference, fingerprint, image, [cluster.address("encoder")], "race-1"
    )
    tokens, finished = run_decoder(cluster, request)
    assert finished.stats.num_reencoded_items == 1
    assert_greedy_match(tokens, reference.generate(messages, MAX_NEW_TOKENS))


def test_items_evicted_after_release_are_recomputed(cluster, reference, fingerprint):
    """An encoder whose cache holds nothing unpinned: the request's lease keeps the item
    while the prefill needs it; once released it is evicted, and the next request has it
    computed again, with the same output."""
    image = noise_image(303, 36, 36)
    address = cluster.address("small-encoder")
    before = stats(cluster, "small-encoder").num_items_computed
    outputs = []
    for attempt in range(2):
        request, messages = direct_request(
            reference, fingerprint, image, [address], f"evict-{attempt}"
        )
        tokens, finished = run_decoder(cluster, request)
        assert finished.stats.num_reencoded_items == 1
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
    assert_greedy_match(outputs[0], reference.generate(messages, MAX_NEW_TOKENS))
    after = stats(cluster, "small-encoder")
    assert after.num_items_computed - before == 2
    assert after.num_cached_items == 0  # released, then evicted


def test_concurrent_identical_encodes_compute_once(cluster, fingerprint):
    image = noise_image(304, 40, 40)
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=image,
        content_hash=decode_image(image).content_hash(fingerprint),
    )
    before = stats(cluster, "encoder").num_items_computed

    async def encode_many() -> list[encoder_pb2.EncodeResponse]:
        async with grpc.aio.insecure_channel(cluster.address("encoder")) as channel:
            stub = encoder_pb2_grpc.EncoderServiceStub(channel)
            slice_request = encoder_pb2.GetEmbeddingSlicesRequest(
                slices=[encoder_pb2.RowSlice(content_hash=item.content_hash, start=0, end=4)]
            )
            calls = [stub.Encode(encoder_pb2.EncodeRequest(items=[item])) for _ in range(8)]
            responses = await asyncio.gather(*calls)
            rows = [message async for message in stub.GetEmbeddingSlices(slice_request)]
            return responses, rows

    responses, rows = asyncio.run(encode_many())
    assert stats(cluster, "encoder").num_items_computed - before == 1
    sources = sorted(r.items[0].source for r in responses)
    assert sources.count(encoder_pb2.ENCODE_SOURCE_COMPUTED) == 1
    assert sum(m.rows.shape[0] for m in rows) == 4
