"""The client's typed values against the proto: every field covered, converted by name,
and every gRPC status mapped to the client's own exception."""

from __future__ import annotations

import dataclasses
import json

import grpc
import pytest

from tessera.client import build_request
from tessera.client_types import (
    DeadlineExceeded,
    Delta,
    InvalidRequest,
    SamplingParams,
    ServerError,
    StructuredOutput,
    TesseraError,
    Unauthenticated,
    Unavailable,
    Usage,
    client_error,
    delta_from_response,
)
from tessera.v1 import common_pb2, gateway_pb2


def names(dataclass_type) -> set[str]:
    return {f.name for f in dataclasses.fields(dataclass_type)}


def test_sampling_params_cover_every_proto_field():
    assert names(SamplingParams) == set(common_pb2.SamplingParams.DESCRIPTOR.fields_by_name)


def test_structured_output_covers_every_grammar_kind():
    kinds = common_pb2.StructuredOutput.DESCRIPTOR.oneofs_by_name["kind"].fields
    assert names(StructuredOutput) == {f.name for f in kinds}


def test_defaults_are_the_proto_defaults():
    assert SamplingParams().to_proto() == common_pb2.SamplingParams()
    assert not SamplingParams().to_proto().HasField("seed")


def test_every_field_converts():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    typed = SamplingParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.75,
        top_k=3,
        seed=0,
        stop_token_ids=(2, 5),
        ignore_eos=True,
        num_top_logprobs=4,
        presence_penalty=0.25,
        frequency_penalty=-0.5,
        repetition_penalty=1.5,
        min_p=0.125,
        logit_bias={11: -100.0, 12: 2.5},
        min_tokens=2,
        structured_output=StructuredOutput(json_schema=schema),
    )
    proto = typed.to_proto()
    for item in dataclasses.fields(SamplingParams):
        # every field set to a non-default value above, so each must show in the proto
        assert item.name in {f.name for f, _ in proto.ListFields()}, item.name
    assert proto.HasField("seed") and proto.seed == 0
    assert list(proto.stop_token_ids) == [2, 5]
    assert dict(proto.logit_bias) == {11: -100.0, 12: 2.5}
    assert proto.presence_penalty == 0.25 and proto.frequency_penalty == -0.5
    assert proto.repetition_penalty == 1.5 and proto.min_p == 0.125 and proto.min_tokens == 2
    assert json.loads(proto.structured_output.json_schema) == schema


@pytest.mark.parametrize(
    ("typed", "kind", "value"),
    [
        (StructuredOutput(json_object=True), "json_object", True),
        (StructuredOutput(regex="[0-9]+"), "regex", "[0-9]+"),
        (StructuredOutput(lark="start: /a+/"), "lark", "start: /a+/"),
    ],
)
def test_structured_output_kinds(typed, kind, value):
    proto = typed.to_proto()
    assert proto.WhichOneof("kind") == kind and getattr(proto, kind) == value


def test_structured_output_takes_one_kind():
    with pytest.raises(ValueError, match="json_object, regex"):
        StructuredOutput(json_object=True, regex="a")


def test_requests_take_typed_and_protobuf_params():
    typed = build_request([], SamplingParams(max_tokens=3, min_p=0.5))
    legacy = build_request([], common_pb2.SamplingParams(max_tokens=3, min_p=0.5))
    assert typed.sampling == legacy.sampling
    assert build_request([]).sampling == common_pb2.SamplingParams()


def test_deltas_from_responses():
    text = gateway_pb2.GenerateResponse(
        delta=gateway_pb2.TextDelta(
            text="hi",
            token_ids=[4, 5],
            logprobs=[
                common_pb2.TokenLogprobs(
                    token_id=4, logprob=-0.5, top=[common_pb2.TopLogprob(token_id=4, logprob=-0.5)]
                )
            ],
        )
    )
    delta = delta_from_response(text)
    assert (delta.text, delta.token_ids, delta.finish_reason) == ("hi", (4, 5), None)
    assert delta.logprobs[0].token_id == 4 and delta.logprobs[0].top[0].logprob == -0.5
    finished = gateway_pb2.GenerateResponse(
        finished=gateway_pb2.GenerateFinished(
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=common_pb2.Usage(prompt_tokens=9, completion_tokens=2, cached_prompt_tokens=1),
        )
    )
    assert delta_from_response(finished) == Delta(finish_reason="length", usage=Usage(9, 2, 1))


class FakeRpcError(grpc.RpcError):
    """What grpc raises, reduced to the two methods the mapping reads."""

    def __init__(self, status: grpc.StatusCode, message: str):
        self.status, self.message = status, message

    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return self.message


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidRequest),
        (grpc.StatusCode.UNAUTHENTICATED, Unauthenticated),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (grpc.StatusCode.INTERNAL, ServerError),
        (grpc.StatusCode.DATA_LOSS, ServerError),
    ],
)
def test_status_codes_map_to_client_errors(status, expected):
    error = client_error(FakeRpcError(status, "what to fix"))
    assert type(error) is expected
    # still a grpc.RpcError with code() and details(): older callers keep working
    assert isinstance(error, TesseraError) and isinstance(error, grpc.RpcError)
    assert (error.code(), error.details()) == (status, "what to fix")
