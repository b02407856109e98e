"""`--fetch-mode whole` (a benchmark baseline): for every chunk the decoder receives the
whole embedding of each item the chunk overlaps, places only the chunk's rows, and
produces the same tokens as the default slice mode."""

from __future__ import annotations

import pytest

from tessera.client import Client, Message
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import common_pb2

PROMPT = [
    Message("user", ["look:", noise_image(61, 40, 30), "and", noise_image(62, 50, 50), "why?"])
]
CHUNK = 7


@pytest.fixture(scope="module")
def whole_fetch(demo_model_dir, cluster):
    """A decoder in whole-fetch mode behind its own gateway, sharing the session encoder."""
    own = Cluster()
    model = ["--model", str(demo_model_dir)]
    try:
        decoder = own.start(
            "decoder",
            "decoder",
            [*model, "--fetch-mode", "whole", "--encoders", cluster.address("encoder")],
        )
        own.start(
            "gateway",
            "gateway",
            [*model, "--encoders", cluster.address("encoder"), "--decoders", decoder],
        )
        own.wait_ready()
        yield own
    finally:
        own.stop()


def test_whole_fetch_receives_whole_items_and_keeps_tokens(whole_fetch, cluster, reference):
    sampling = common_pb2.SamplingParams(max_tokens=8)
    with Client(whole_fetch.address("gateway")) as client:
        whole = client.complete(PROMPT, sampling, CHUNK, cache_salt="whole-fetch")
    with Client(cluster.address("gateway")) as client:
        sliced = client.complete(PROMPT, sampling, CHUNK, cache_salt="whole-fetch")

    expected = reference.generate([(m.role, list(m.parts)) for m in PROMPT], 8)
    assert whole.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(whole.token_ids, expected)
    assert whole.token_ids == sliced.token_ids

    prompt = whole.prompt_token_ids
    image = reference.placeholder_token_id
    runs = [p for p in range(len(prompt)) if prompt[p] == image]
    rows_per_item = len(runs) // 2
    item_bytes = rows_per_item * reference.hidden_size * 4
    offsets = [runs[0], runs[rows_per_item]]
    assert len(whole.stats.decoder.chunks) == len(sliced.stats.decoder.chunks) > 4
    for mine, theirs in zip(whole.stats.decoder.chunks, sliced.stats.decoder.chunks, strict=True):
        overlapping = sum(1 for o in offsets if o < mine.end and mine.start < o + rows_per_item)
        # Rows placed are the chunk's own; bytes received are whole items.
        assert mine.num_embedding_rows == theirs.num_embedding_rows
        assert mine.num_embedding_rows == prompt[mine.start : mine.end].count(image)
        assert mine.num_embedding_bytes == overlapping * item_bytes
    assert whole.stats.num_embedding_bytes > sliced.stats.num_embedding_bytes
