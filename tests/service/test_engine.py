"""The engine under load, through the real services: packed batches, preemption, prefix
caching and cancellation, all checked against the model's own generate()."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from tessera.client import Client, Message
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc
from tests.cluster import Cluster
from tests.reference import assert_greedy_match, noise_image

MAX_NEW_TOKENS = 10
# Tiny demo model: one 16-token block holds 8 KiB of K/V. Twelve blocks force
# preemption when six requests of 3-6 blocks each run together.
SMALL_KV_BYTES = 12 * 8192


@pytest.fixture(scope="module")
def small(demo_model_dir, cluster):
    """A decoder with a small KV cache and a small step budget, behind its own gateway."""
    own = Cluster()
    model = ["--model", str(demo_model_dir)]
    try:
        decoder = own.start(
            "decoder",
            "decoder",
            [
                *model,
                "--kv-cache-bytes",
                str(SMALL_KV_BYTES),
                "--max-num-seqs",
                "6",
                "--max-num-batched-tokens",
                "24",
                "--max-chunk-tokens",
                "16",
            ],
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


def decoder_stats(address: str) -> decoder_pb2.DecoderStats:
    with grpc.insecure_channel(address) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        return stub.GetStats(decoder_pb2.GetDecoderStatsRequest(), timeout=10)


def greedy(max_tokens: int = MAX_NEW_TOKENS) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens)


MIXED = [
    # (prompt, chunk size, delay before sending in seconds)
    ([("user", [noise_image(501, 40, 40), "Describe it."])], 3, 0.0),
    ([("user", ["Only text, a little longer than the others, about many things."])], 5, 0.0),
    ([("user", [noise_image(502, 30, 50), "one", noise_image(503, 50, 30), "two"])], 8, 0.0),
    ([("system", ["Be brief."]), ("user", [noise_image(504, 44, 44), "What?"])], 16, 0.0),
    ([("user", [noise_image(505, 20, 60), "and", noise_image(501, 40, 40), "compare"])], 7, 0.15),
    ([("user", ["short"])], 16, 0.2),
]


def test_mixed_batches_with_preemption_equal_generate(small, reference):
    gateway = small.address("gateway")
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def send(index: int) -> None:
        prompt, chunk, delay = MIXED[index]
        time.sleep(delay)
        try:
            with Client(gateway) as client:
                results[index] = client.complete(
                    [Message(r, p) for r, p in prompt], greedy(), chunk, cache_salt="mixed"
                )
        except BaseException as error:
            errors.append(error)

    before = decoder_stats(small.address("decoder"))
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(MIXED))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    after = decoder_stats(small.address("decoder"))

    for index, (prompt, _, _) in enumerate(MIXED):
        expected = reference.generate(prompt, MAX_NEW_TOKENS)
        assert results[index].prompt_token_ids == expected.prompt_token_ids
        assert_greedy_match(results[index].token_ids, expected)
    assert after.num_preemptions > before.num_preemptions, "the test should force preemption"
    # Requests shared forwards: more requests ran than there were steps.
    num_steps = after.num_steps - before.num_steps
    assert after.num_scheduled_requests - before.num_scheduled_requests > 1.5 * num_steps
    assert after.num_free_kv_blocks == after.num_kv_blocks
    assert after.num_running == 0 and after.num_waiting == 0


def test_prefix_cache_reuses_blocks_and_fetches_no_rows_for_them(cluster, reference):
    image = noise_image(601, 48, 48)
    first_turn = [("system", ["You describe pictures."]), ("user", [image, "What is in it?"])]
    with Client(cluster.address("gateway")) as client:
        first = client.complete(
            [Message(r, p) for r, p in first_turn], greedy(), 4, cache_salt="prefix"
        )
        again = client.complete(
            [Message(r, p) for r, p in first_turn], greedy(), 4, cache_salt="prefix"
        )
        answer = reference.processor.tokenizer.decode(first.token_ids, skip_special_tokens=True)
        second_turn = [*first_turn, ("assistant", [answer]), ("user", ["And the colours?"])]
        follow = client.complete(
            [Message(r, p) for r, p in second_turn], greedy(), 4, cache_salt="prefix"
        )
        other_image = [first_turn[0], ("user", [noise_image(602, 48, 48), "What is in it?"])]
        other = client.complete(
            [Message(r, p) for r, p in other_image], greedy(), 4, cache_salt="prefix"
        )

    block = 16
    for result, prompt in [(again, first_turn), (follow, second_turn), (other, other_image)]:
        assert_greedy_match(result.token_ids, reference.generate(prompt, MAX_NEW_TOKENS))
    assert first.stats.decoder.num_cached_prompt_tokens == 0
    image_start = first.prompt_token_ids.index(reference.image_token_id)
    image_end = image_start + 16
    # The same request again: every full block but the one holding the last token.
    cached = again.stats.decoder.num_cached_prompt_tokens
    assert cached == (len(again.prompt_token_ids) - 1) // block * block
    assert cached > image_end
    for stats in (again, follow):
        chunks = stats.stats.decoder.chunks
        assert chunks[0].start == stats.stats.decoder.num_cached_prompt_tokens
        covered = stats.prompt_token_ids[chunks[0].start :].count(reference.image_token_id)
        assert sum(c.num_embedding_rows for c in chunks) == covered == 0
        assert stats.stats.num_embedding_bytes == 0
    assert follow.stats.decoder.num_cached_prompt_tokens >= cached
    # Same text, other image: nothing past the image's start is reused.
    assert other.stats.decoder.num_cached_prompt_tokens <= image_start // block * block
    assert other.stats.num_embedding_bytes == 16 * reference.hidden_size * 4


def test_cancelled_request_frees_its_blocks(small):
    address = small.address("decoder")
    start = decoder_stats(address)
    assert start.num_free_kv_blocks == start.num_kv_blocks
    request = decoder_pb2.DecodeRequest(
        request_id="cancel-me",
        prompt_token_ids=[1, 5, 205, 6, 205],
        sampling=common_pb2.SamplingParams(max_tokens=150, ignore_eos=True),
    )
    with grpc.insecure_channel(address) as channel:
        call = decoder_pb2_grpc.DecoderServiceStub(channel).Generate(request, timeout=60)
        next(call)  # the first token: the request holds blocks now
        assert decoder_stats(address).num_running == 1
        call.cancel()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        stats = decoder_stats(address)
        if stats.num_running == 0 and stats.num_free_kv_blocks == stats.num_kv_blocks:
            break
        time.sleep(0.05)
    assert stats.num_running == 0
    assert stats.num_free_kv_blocks == stats.num_kv_blocks
    assert stats.num_aborted > start.num_aborted


def test_request_larger_than_the_whole_kv_cache_is_refused(small):
    request = decoder_pb2.DecodeRequest(
        request_id="too-big",
        prompt_token_ids=[1, 5, 205, 6, 205],
        sampling=common_pb2.SamplingParams(max_tokens=12 * 16),
    )
    with (
        grpc.insecure_channel(small.address("decoder")) as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        list(decoder_pb2_grpc.DecoderServiceStub(channel).Generate(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "KV cache" in caught.value.details()


def test_a_client_deadline_ends_the_request_everywhere(cluster):
    """The deadline travels gateway -> decoder: when it passes, the decoder drops the
    request (and with it its blocks and fetches), not just the client."""
    address = cluster.address("decoder")
    start = decoder_stats(address)
    with (
        Client(cluster.address("gateway"), timeout_seconds=0.5) as client,
        pytest.raises(grpc.RpcError) as caught,
    ):
        client.complete(
            [Message("user", ["word " * 500])],
            common_pb2.SamplingParams(max_tokens=4),
            max_chunk_tokens=1,
            cache_salt="deadline",
        )
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 2
    while decoder_stats(address).num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = decoder_stats(address)
    assert stats.num_running == 0 and stats.num_free_kv_blocks == stats.num_kv_blocks
    assert stats.num_aborted > start.num_aborted
