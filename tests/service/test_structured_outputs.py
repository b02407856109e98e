"""Structured outputs over HTTP with the real `openai` client: response_format and vLLM's
guided_json / guided_regex, masked by the decoder's grammar (decoder_service/grammar.py).

The demo model has random weights: unconstrained, it writes gibberish (checked below), so
output that parses and validates against its schema shows the mask at work."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
import openai
import pytest

from tessera.client import Client, Message
from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster
from tessera.v1 import common_pb2

MODEL = "demo-structured"
PROMPT = "Describe a person as JSON."

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"enum": ["cat", "dog", "bird"]},
        "tags": {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "pet", "tags"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "owner": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "home": {"type": "boolean"},
                "rooms": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"size": {"enum": ["small", "large"]}},
                        "required": ["size"],
                        "additionalProperties": False,
                    },
                    "maxItems": 2,
                },
            },
            "required": ["city", "home", "rooms"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "owner"],
    "additionalProperties": False,
}
SCHEMAS = {"person": PERSON, "nested": NESTED}


@pytest.fixture(scope="module")
def stack(demo_model_dir):
    services = Cluster()
    services.http_port = free_port()
    try:
        services.start_stack(
            demo_model_dir,
            gateway_args=["--http-port", str(services.http_port), "--served-model-name", MODEL],
        )
        services.wait_ready()
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1",
        api_key="unused",
        max_retries=0,
        timeout=120,
    )


def chat(client, prompt: str = PROMPT, **options):
    options = {"model": MODEL, "max_tokens": 200, "temperature": 0, **options}
    return client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **options)


def schema_format(name: str) -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True},
    }


def test_without_a_format_the_demo_model_writes_no_json(client):
    text = chat(client, max_tokens=40).choices[0].message.content
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 7}])
def test_json_schema_output_validates(client, name, sampling):
    response = chat(client, response_format=schema_format(name), **sampling)
    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])


def test_a_seed_reproduces_sampled_structured_output(client):
    options = {"response_format": schema_format("person"), "temperature": 1.0, "seed": 11}
    first = chat(client, **options).choices[0].message.content
    assert chat(client, **options).choices[0].message.content == first


def test_streamed_json_schema_output_validates(client):
    stream = chat(client, response_format=schema_format("nested"), stream=True)
    pieces, reasons = [], []
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            reasons.append(chunk.choices[0].finish_reason)
    assert reasons[-1] == "stop"
    jsonschema.validate(json.loads("".join(pieces)), NESTED)


def test_json_object_is_one_json_object(client):
    """After "{" the demo model prefers a key's quote to "}" (by ~3 logits), and random
    weights rarely close a free-form key (one token in ~1500 is a quote): seeds at a high
    temperature are tried until one output finishes. Each output is the start of a JSON
    object, and one the grammar completed parses as one."""
    for seed in range(30):
        choice = chat(
            client,
            response_format={"type": "json_object"},
            max_tokens=8,
            temperature=2.0,
            seed=seed,
        ).choices[0]
        assert choice.message.content.startswith("{"), choice.message.content
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
            return
    raise AssertionError("no seed finished a JSON object")


def test_text_format_is_unconstrained(client):
    plain = chat(client, max_tokens=12).choices[0].message.content
    text = chat(client, max_tokens=12, response_format={"type": "text"})
    assert text.choices[0].message.content == plain


def test_guided_regex_and_guided_json(client):
    regex = r"(cat|dog)-[0-9]{2}"
    text = chat(client, extra_body={"guided_regex": regex}).choices[0].message.content
    assert re.fullmatch(regex, text), text
    response = chat(client, extra_body={"guided_json": json.dumps(PERSON)})
    jsonschema.validate(json.loads(response.choices[0].message.content), PERSON)


BAD_FORMATS = [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}, "foo"),
    (
        {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"properties": {"a": {"$ref": "#/no"}}}},
        },
        "no",
    ),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
    # A schema that nothing matches.
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": False}}, "json_schema"),
    ({"type": "xml"}, "response_format"),
    ({"type": "json_object", "schema": {}}, "response_format"),
    ("json", "response_format"),
]


@pytest.mark.parametrize(("response_format", "message"), BAD_FORMATS)
def test_bad_formats_are_400_and_the_next_request_succeeds(client, response_format, message):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, response_format=response_format)
    assert message in str(caught.value)
    assert chat(client, max_tokens=2).choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": BAD_FORMATS[0][0]}, "response_format"),
        ({"response_format": BAD_FORMATS[1][0]}, "response_format"),
        (
            {"guided_json": {"type": "object", "properties": {"a": {"type": "strin"}}}},
            "guided_json",
        ),
        ({"guided_regex": "a(b"}, "guided_regex"),
    ],
)
def test_a_grammar_llguidance_refuses_is_a_400_naming_the_request_field(client, extra, param):
    """The gateway checks the grammar itself: the error names the field the client sent,
    not the decoder's structured_output."""
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, extra_body=extra)
    assert caught.value.body["param"] == param
    assert "structured_output" not in caught.value.body["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "a(b"}, "regex"),
        ({"guided_grammar": "start: x"}, "guided_grammar"),
        ({"structured_outputs": {"regex": "a"}}, "structured_outputs"),
        ({"guided_regex": "a", "guided_json": {}}, "only one of"),
        ({"guided_regex": "a" * 70000}, "at most"),
    ],
)
def test_refused_and_bad_vllm_fields_are_400(client, extra, param):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, extra_body=extra)
    assert param in str(caught.value)


def test_a_bad_stream_is_a_plain_400(client):
    with pytest.raises(openai.BadRequestError, match="foo"):
        chat(
            client,
            stream=True,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "foo"}},
            },
        )


def test_lark_grammar_over_grpc(stack):
    lark = common_pb2.StructuredOutput(lark='start: ("yes" | "no") " " NUM\nNUM: /[0-9]{2}/')
    sampling = common_pb2.SamplingParams(max_tokens=20, structured_output=lark)
    with Client(stack.address("gateway"), max_retries=0) as grpc_client:
        completion = grpc_client.complete([Message("user", [PROMPT])], sampling)
        assert re.fullmatch(r"(yes|no) [0-9]{2}", completion.text), completion.text
        assert completion.finish_reason == "stop"
        bad = common_pb2.SamplingParams(
            max_tokens=4, structured_output=common_pb2.StructuredOutput(lark="start: nothing")
        )
        with pytest.raises(grpc.RpcError) as caught:
            grpc_client.complete([Message("user", [PROMPT])], bad)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output.lark" in caught.value.details()


def test_a_mask_applies_to_its_own_request_only(client):
    """Constrained and free requests decoded together: the free one's text is what it is
    alone, the constrained one's validates."""
    alone = chat(client, max_tokens=24).choices[0].message.content
    with ThreadPoolExecutor(max_workers=4) as pool:
        structured = [
            pool.submit(chat, client, response_format=schema_format("person")) for _ in range(2)
        ]
        free = [pool.submit(chat, client, max_tokens=24) for _ in range(2)]
        for future in structured:
            jsonschema.validate(json.loads(future.result().choices[0].message.content), PERSON)
        assert [f.result().choices[0].message.content for f in free] == [alone, alone]
