"""Every gRPC method of every service, fed random and boundary messages straight from
hypothesis (built from the methods' own descriptors): no crash, no hang, no UNKNOWN or
INTERNAL; afterwards a good request is still exact.

Examples are derandomized (a fixed seed), so a run is reproducible; the budget per
method is small enough for CI.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.client import Client, Message
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import (
    common_pb2,
    decoder_pb2,
    decoder_pb2_grpc,
    encoder_pb2,
    encoder_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
)

EXAMPLES_PER_METHOD = 40
DEADLINE_SECONDS = 30
# Statuses a service may answer a hostile message with.
ACCEPTABLE = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
}
_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_HASHES = st.sampled_from(["ab" * 32, "0" * 64, "", "xyz"]) | _TEXT
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    kind = field.type
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        # Small values reach the services' real paths; the extremes test the bounds.
        return st.integers(0, 64) | st.integers(low, high)
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        width = 32 if kind == FieldDescriptor.TYPE_FLOAT else 64
        return st.floats(width=width, allow_nan=True, allow_infinity=True)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return _HASHES if "hash" in field.name else _TEXT
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64) | st.just(noise_image(3, 16, 16))
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values]) | st.integers(0, 99)
    raise AssertionError(f"no strategy for {field.full_name}")


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy:
    """Messages of `descriptor` with a random subset of fields set, nested up to 3 deep."""

    @st.composite
    def build(draw):
        message = message_factory.GetMessageClass(descriptor)()
        for field in descriptor.fields:
            nested = field.message_type
            if (nested is not None and depth >= 3) or not draw(st.booleans()):
                continue
            target = getattr(message, field.name)
            if nested is not None and nested.GetOptions().map_entry:
                key, value = nested.fields_by_name["key"], nested.fields_by_name["value"]
                for _ in range(draw(st.integers(0, 3))):
                    target[draw(_scalar(key))] = draw(_scalar(value))
            elif nested is not None:
                values = [draw(messages(nested, depth + 1)) for _ in range(_count(draw, field))]
                if field.is_repeated:
                    target.extend(values)
                else:
                    target.CopyFrom(values[0])
            elif field.is_repeated:
                target.extend(draw(_scalar(field)) for _ in range(_count(draw, field)))
            else:
                setattr(message, field.name, draw(_scalar(field)))
        return message

    return build()


def _count(draw, field: FieldDescriptor) -> int:
    if not field.is_repeated:
        return 1
    return draw(st.integers(0, 24 if field.type != FieldDescriptor.TYPE_MESSAGE else 3))


def _call(method, request) -> grpc.StatusCode:
    try:
        response = method(request, timeout=DEADLINE_SECONDS)
        if not isinstance(response, type(None)) and hasattr(response, "__iter__"):
            for _ in response:
                pass
        return grpc.StatusCode.OK
    except grpc.RpcError as error:
        return error.code()


METHODS = {
    "gateway.Generate": ("gateway", gateway_pb2_grpc.GatewayServiceStub, "Generate"),
    "decoder.Generate": ("decoder", decoder_pb2_grpc.DecoderServiceStub, "Generate"),
    "decoder.GetStats": ("decoder", decoder_pb2_grpc.DecoderServiceStub, "GetStats"),
    "encoder.Encode": ("encoder", encoder_pb2_grpc.EncoderServiceStub, "Encode"),
    "encoder.GetEmbeddingSlices": (
        "encoder",
        encoder_pb2_grpc.EncoderServiceStub,
        "GetEmbeddingSlices",
    ),
    "encoder.GetEmbeddingRows": (
        "encoder",
        encoder_pb2_grpc.EncoderServiceStub,
        "GetEmbeddingRows",
    ),
    "encoder.ReleaseLeases": ("encoder", encoder_pb2_grpc.EncoderServiceStub, "ReleaseLeases"),
    "encoder.GetStats": ("encoder", encoder_pb2_grpc.EncoderServiceStub, "GetStats"),
}
REQUEST_TYPES = {
    "gateway.Generate": gateway_pb2.GenerateRequest,
    "decoder.Generate": decoder_pb2.DecodeRequest,
    "decoder.GetStats": decoder_pb2.GetDecoderStatsRequest,
    "encoder.Encode": encoder_pb2.EncodeRequest,
    "encoder.GetEmbeddingSlices": encoder_pb2.GetEmbeddingSlicesRequest,
    "encoder.GetEmbeddingRows": encoder_pb2.GetEmbeddingSlicesRequest,
    "encoder.ReleaseLeases": encoder_pb2.ReleaseLeasesRequest,
    "encoder.GetStats": encoder_pb2.GetEncoderStatsRequest,
}


@pytest.mark.parametrize("name", list(METHODS))
def test_random_messages_get_an_honest_status(cluster, name):
    service, stub_class, method_name = METHODS[name]
    channel = grpc.insecure_channel(cluster.address(service))
    method = getattr(stub_class(channel), method_name)
    seen: dict[str, str] = {}

    @settings(
        max_examples=EXAMPLES_PER_METHOD,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=messages(REQUEST_TYPES[name].DESCRIPTOR))
    def check(request) -> None:
        code = _call(method, request)
        seen[code.name] = seen.get(code.name, "") or str(request)[:200]
        assert code in ACCEPTABLE, f"{name} answered {code.name} to:\n{request}"

    try:
        check()
    finally:
        channel.close()
    assert seen, "no example ran"


def test_a_good_request_is_exact_after_the_fuzzing(cluster, reference):
    prompt = [("user", [noise_image(901, 40, 40), "What is this?"])]
    expected = reference.generate(prompt, 6)
    with Client(cluster.address("gateway")) as client:
        done = client.complete(
            [Message(role, parts) for role, parts in prompt],
            common_pb2.SamplingParams(max_tokens=6),
        )
    assert_greedy_match(done.token_ids, expected, "after fuzzing")
