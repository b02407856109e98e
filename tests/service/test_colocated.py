"""`tessera decoder --colocated-encoder` (the layout vLLM v1 runs by default): the media
encoder in the decoder's process, behind a gateway with no encoders. Same tokens as
generate(), each chunk gets exactly its own rows, and an item is encoded once, then
served from the local cache."""

from __future__ import annotations

import pytest

from tessera.client import Client, Message
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import common_pb2

IMAGES = [noise_image(71, 40, 30), noise_image(72, 50, 50)]
MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module")
def colocated(demo_model_dir):
    own = Cluster()
    model = ["--model", str(demo_model_dir)]
    try:
        decoder = own.start("decoder", "decoder", [*model, "--colocated-encoder"])
        own.start("gateway", "gateway", [*model, "--decoders", decoder])
        own.wait_ready()
        yield own
    finally:
        own.stop()


def prompt(words: str) -> list[Message]:
    return [Message("user", [words, IMAGES[0], "and", IMAGES[1], "why?"])]


@pytest.mark.parametrize("chunk", [7, 64])
def test_colocated_tokens_equal_generate_and_chunks_get_their_own_rows(colocated, reference, chunk):
    messages = prompt(f"look at chunk {chunk}:")
    with Client(colocated.address("gateway")) as client:
        done = client.complete(
            messages, common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS), chunk
        )
    expected = reference.generate([(m.role, list(m.parts)) for m in messages], MAX_NEW_TOKENS)
    assert done.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(done.token_ids, expected)
    image = reference.placeholder_token_id
    tokens = done.prompt_token_ids
    row_bytes = reference.hidden_size * 4
    for record in done.stats.decoder.chunks:
        rows = tokens[record.start : record.end].count(image)
        assert record.num_embedding_rows == rows
        assert record.num_embedding_bytes == rows * row_bytes


def test_an_item_is_encoded_once_then_served_from_the_local_cache(colocated, reference):
    sampling = common_pb2.SamplingParams(max_tokens=2)
    with Client(colocated.address("gateway")) as client:
        first = client.complete(prompt("first look:"), sampling, 16, cache_salt="once")
        # Other words before the images: no prefix-cache hit, the rows are needed again.
        again = client.complete(prompt("a second, longer look:"), sampling, 16, cache_salt="once")
    assert first.stats.decoder.num_reencoded_items == 2  # both images encoded here
    assert again.stats.decoder.num_reencoded_items == 0  # both from the local cache
    assert again.stats.num_embedding_bytes > 0
