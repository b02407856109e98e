"""Sampling parameters that no sampler can use never reach the engine's step, and one that
slips through to a decoder is greedy: four streams running beside it finish exactly as
they do alone. (Before: temperature 1e-39 made torch.multinomial raise inside the step
and every request of the step died, on every decoder the gateway retried it on.)"""

from __future__ import annotations

import math
import threading

import grpc
import pytest

from tessera.client import Client, Message
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc

NUM_STREAMS = 4
STREAM_TOKENS = 120  # long enough that the poison arrives while every stream decodes


def stream_prompt(index: int) -> list[Message]:
    return [Message("user", [f"Tell story number {index} about a red cat and a boat."])]


def long_sampling() -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=STREAM_TOKENS, ignore_eos=True)


@pytest.mark.parametrize(
    "name,params",
    [
        ("nan temperature", {"temperature": math.nan}),
        ("infinite temperature", {"temperature": math.inf}),
        ("negative temperature", {"temperature": -1.0}),
        ("nan top_p", {"top_p": math.nan}),
    ],
)
def test_unusable_sampling_is_invalid_at_gateway_and_decoder(cluster, name, params):
    sampling = common_pb2.SamplingParams(max_tokens=3, **params)
    with Client(cluster.address("gateway"), max_retries=0) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.complete(stream_prompt(0), sampling)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        prompt = client.complete(stream_prompt(0), common_pb2.SamplingParams(max_tokens=1))
    direct = decoder_pb2.DecodeRequest(
        request_id="direct-" + name.replace(" ", "-"),
        prompt_token_ids=prompt.prompt_token_ids,
        sampling=sampling,
    )
    channel = grpc.insecure_channel(cluster.address("decoder"))
    with channel, pytest.raises(grpc.RpcError) as refused:
        list(decoder_pb2_grpc.DecoderServiceStub(channel).Generate(direct, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
    assert "must be" in refused.value.details()


def test_a_vanishing_temperature_is_greedy_and_harms_no_stream_beside_it(cluster):
    gateway = cluster.address("gateway")
    with Client(gateway) as client:
        alone = [client.complete(stream_prompt(i), long_sampling()) for i in range(NUM_STREAMS)]
        greedy = client.complete(stream_prompt(9), common_pb2.SamplingParams(max_tokens=8))

    started = threading.Barrier(NUM_STREAMS + 1)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run_stream(index: int) -> None:
        tokens: list[int] = []
        try:
            with Client(gateway, max_retries=0) as client:
                for response in client.stream(stream_prompt(index), long_sampling()):
                    if response.HasField("delta") and response.delta.token_ids:
                        if not tokens:
                            started.wait(60)  # every stream is decoding
                        tokens += response.delta.token_ids
            results[index] = tokens
        except BaseException as error:
            errors.append(error)
            started.abort()

    threads = [threading.Thread(target=run_stream, args=(i,)) for i in range(NUM_STREAMS)]
    for thread in threads:
        thread.start()
    started.wait(120)
    # Straight to the decoder, past the gateway's checks: 1e-39 is finite and > 0.
    poison = decoder_pb2.DecodeRequest(
        request_id="poison",
        prompt_token_ids=greedy.prompt_token_ids,
        sampling=common_pb2.SamplingParams(max_tokens=8, temperature=1e-39),
    )
    with grpc.insecure_channel(cluster.address("decoder")) as channel:
        answers = list(decoder_pb2_grpc.DecoderServiceStub(channel).Generate(poison, timeout=60))
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    poisoned = [
        t for answer in answers if answer.HasField("tokens") for t in answer.tokens.token_ids
    ]
    assert poisoned == greedy.token_ids, "a temperature below 1e-5 samples greedily"
    for index in range(NUM_STREAMS):
        assert results[index] == alone[index].token_ids, f"stream {index} changed"
