"""The request that resumes an answer on another decoder, and the usage reported."""

from __future__ import annotations

from gateway.resume import as_one_answer, can_resume, continuation
from tessera.v1 import common_pb2, decoder_pb2


def request(**sampling) -> decoder_pb2.DecodeRequest:
    return decoder_pb2.DecodeRequest(
        request_id="r",
        prompt_token_ids=[1, 5, 9],
        sampling=common_pb2.SamplingParams(**sampling),
        max_chunk_tokens=16,
    )


def test_the_continuation_asks_for_the_rest_after_the_tokens_received():
    original = request(max_tokens=8, min_tokens=5, temperature=0.0)
    resumed = continuation(original, [40, 41, 42])
    assert list(resumed.prompt_token_ids) == [1, 5, 9, 40, 41, 42]
    assert resumed.sampling.max_tokens == 5 and resumed.sampling.min_tokens == 2
    assert resumed.max_chunk_tokens == 16 and resumed.request_id == "r"
    assert list(original.prompt_token_ids) == [1, 5, 9], "the original is left alone"
    assert original.sampling.max_tokens == 8


def test_budgets_never_go_below_what_a_request_may_ask():
    resumed = continuation(request(max_tokens=2, min_tokens=1), [7, 7])
    assert resumed.sampling.max_tokens == 1 and resumed.sampling.min_tokens == 0
    assert continuation(request(), [7]).sampling.max_tokens == 0, "0 stays the server's limit"


def test_usage_is_the_clients_one_request():
    finished = decoder_pb2.DecodeResponse(
        finished=decoder_pb2.DecodeFinished(
            usage=common_pb2.Usage(prompt_tokens=6, completion_tokens=5)
        )
    )
    as_one_answer(finished, 3)
    assert (finished.finished.usage.prompt_tokens, finished.finished.usage.completion_tokens) == (
        3,
        8,
    )


def test_what_depends_on_the_dead_decoders_state_is_not_resumed():
    assert can_resume(common_pb2.SamplingParams(temperature=0.7, repetition_penalty=1.2))
    assert not can_resume(common_pb2.SamplingParams(presence_penalty=0.5))
    assert not can_resume(common_pb2.SamplingParams(frequency_penalty=0.5))
    grammar = common_pb2.SamplingParams()
    grammar.structured_output.SetInParent()
    assert not can_resume(grammar)
