"""The Python client against the real stack: typed deltas add up to the completion,
typed and protobuf parameters ask for the same thing, and failures are the client's own
exceptions (which are still grpc.RpcErrors)."""

from __future__ import annotations

import math

import grpc
import pytest

from tessera.client import (
    AsyncClient,
    Client,
    DeadlineExceeded,
    Delta,
    InvalidRequest,
    Message,
    SamplingParams,
    Unavailable,
)
from tessera.launcher import free_port
from tessera.v1 import common_pb2

PROMPT = [Message("user", ["Name three colours of the sea."])]


def test_deltas_add_up_to_the_completion(cluster):
    sampling = SamplingParams(max_tokens=6, ignore_eos=True, num_top_logprobs=2)
    with Client(cluster.address("gateway")) as client:
        deltas = list(client.deltas(PROMPT, sampling))
        completion = client.complete(PROMPT, sampling)
    *pieces, last = deltas
    assert all(isinstance(d, Delta) and d.finish_reason is None for d in pieces)
    assert "".join(d.text for d in pieces) == completion.text
    assert [t for d in pieces for t in d.token_ids] == completion.token_ids
    assert [p.token_id for d in pieces for p in d.logprobs] == completion.token_ids
    assert all(len(p.top) == 2 for d in pieces for p in d.logprobs)
    assert last.text == "" and last.finish_reason == "length"
    assert last.usage is not None and last.usage.completion_tokens == 6
    assert last.usage.prompt_tokens == len(completion.prompt_token_ids)


def test_typed_and_protobuf_parameters_agree(cluster):
    """Backward compatibility: a seeded sampled request gives the same tokens either way."""
    typed = SamplingParams(max_tokens=8, temperature=0.9, top_k=20, seed=7, ignore_eos=True)
    legacy = common_pb2.SamplingParams(
        max_tokens=8, temperature=0.9, top_k=20, seed=7, ignore_eos=True
    )
    with Client(cluster.address("gateway")) as client:
        assert client.complete(PROMPT, typed).token_ids == client.complete(PROMPT, legacy).token_ids


def test_async_deltas(cluster):
    import asyncio

    async def collect() -> list[Delta]:
        async with AsyncClient(cluster.address("gateway")) as client:
            return [d async for d in client.deltas(PROMPT, SamplingParams(max_tokens=3))]

    deltas = asyncio.run(collect())
    assert deltas[-1].finish_reason is not None and deltas[-1].usage is not None


def test_bad_input_is_invalid_request_naming_the_field(cluster):
    client = Client(cluster.address("gateway"), max_retries=0)
    with client, pytest.raises(InvalidRequest) as refused:
        client.complete(PROMPT, SamplingParams(max_tokens=2, temperature=math.nan))
    assert "temperature" in refused.value.details()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(refused.value, grpc.RpcError)


def test_no_gateway_is_unavailable():
    client = Client(f"127.0.0.1:{free_port()}", max_retries=0, timeout_seconds=30)
    with client, pytest.raises(Unavailable):
        list(client.deltas(PROMPT))


def test_a_passed_deadline_is_deadline_exceeded(cluster):
    # a deadline no generation can meet (nothing is measured: the call can only fail)
    client = Client(cluster.address("gateway"), max_retries=0, timeout_seconds=1e-6)
    with client, pytest.raises(DeadlineExceeded):
        client.complete(PROMPT, SamplingParams(max_tokens=4))
