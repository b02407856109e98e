"""The OpenAPI document cannot drift from the gateway: the fields the request parsers read
are exactly the fields it documents, and every status the HTTP server maps to is listed."""

from __future__ import annotations

import ast
import inspect
import re
from types import ModuleType

import jsonschema_rs
import pytest
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import (
    access_log,
    completions_api,
    fields,
    http_server,
    openai_api,
    sampling_body,
    structured,
    tools,
)
from gateway.openapi import DOCUMENT

SCHEMAS = DOCUMENT["components"]["schemas"]
CHAT = DOCUMENT["paths"]["/v1/chat/completions"]["post"]


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _key_read(node: ast.AST, receiver: str) -> str | None:
    """The literal key in `receiver.get("k")`, `receiver["k"]` or `helper(receiver, "k")`."""
    if isinstance(node, ast.Subscript) and _is(node.value, receiver):
        return _literal(node.slice)
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and _is(func.value, receiver):
        return _literal(node.args[0])
    if len(node.args) >= 2 and _is(node.args[0], receiver):
        return _literal(node.args[1])
    return None


def fields_read(receiver: str, *modules: ModuleType) -> set[str]:
    """Every literal key the modules read from a variable named `receiver`."""
    keys = set()
    for module in modules:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            key = _key_read(node, receiver)
            if key is not None:
                keys.add(key)
    return keys


def documented(schema: dict) -> set[str]:
    return set(schema["properties"])


def test_the_request_fields_read_are_the_fields_documented():
    read = fields_read("body", openai_api, sampling_body, http_server, structured, tools)
    assert "messages" in read and "stream" in read  # the scan sees both modules
    assert read == fields.CHAT_IMPLEMENTED
    assert read | set(fields.CHAT_NO_OPS) == documented(SCHEMAS["ChatCompletionRequest"])


def test_the_completions_fields_documented_are_the_registry():
    accepted = fields.COMPLETIONS_IMPLEMENTED | set(fields.COMPLETIONS_NO_OPS)
    assert documented(SCHEMAS["CompletionRequest"]) == accepted
    assert fields_read("body", completions_api) <= fields.COMPLETIONS_IMPLEMENTED


def test_the_token_endpoints_fields_documented_are_the_registry():
    assert documented(SCHEMAS["TokenizeRequest"]) == fields.TOKENIZE.accepted
    assert documented(SCHEMAS["DetokenizeRequest"]) == fields.DETOKENIZE.accepted


def test_refused_fields_are_neither_accepted_nor_documented():
    for endpoint, schema in [
        (fields.CHAT, "ChatCompletionRequest"),
        (fields.COMPLETIONS, "CompletionRequest"),
    ]:
        assert not set(endpoint.refused) & endpoint.accepted
        assert not set(endpoint.refused) & documented(SCHEMAS[schema])
        assert SCHEMAS[schema]["additionalProperties"] is False


@pytest.mark.parametrize(
    ("receiver", "schema"),
    [
        ("message", SCHEMAS["Message"]),
        ("options", SCHEMAS["ChatCompletionRequest"]["properties"]["stream_options"]),
        ("audio", SCHEMAS["InputAudioPart"]["properties"]["input_audio"]),
    ],
)
def test_nested_fields_read_are_documented(receiver: str, schema: dict):
    assert fields_read(receiver, openai_api, tools) == documented(schema)


def test_content_part_types_are_the_ones_parsed():
    types = {SCHEMAS[name]["properties"]["type"]["const"] for name in SCHEMAS if "Part" in name}
    assert types == {"text", "input_audio", *openai_api._URL_PARTS}


def test_every_status_the_server_answers_is_documented():
    mapped = set(access_log.HTTP_STATUS.values()) - {200}
    # 400 bad input, 413 too large, 500 a backend code with no mapping (http_error).
    assert {*mapped, 400, 413, 500} <= {int(code) for code in CHAT["responses"]}


@settings(max_examples=500, derandomize=True, database=None)
@given(st.text(alphabet="AB+/=\n é", max_size=10))
def test_the_base64_the_gateway_decodes_is_the_documented_pattern(data: str):
    matches = re.fullmatch(openai_api.BASE64_PATTERN, data) is not None
    assert (openai_api.decode_base64(data) is not None) == matches


def test_the_document_is_valid_openapi_3_1():
    assert DOCUMENT["openapi"].startswith("3.1")
    schemathesis.openapi.from_dict(DOCUMENT).validate()


def _request_validator() -> jsonschema_rs.Validator:
    schema = {**SCHEMAS["ChatCompletionRequest"], "components": DOCUMENT["components"]}
    return jsonschema_rs.validator_for(schema)


GOOD = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                {"type": "audio_url", "audio_url": "https://example.com/a.wav"},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            ],
        },
    ],
    "max_tokens": 8,
    "temperature": 0,
    "stop": ["\n"],
    "stream": True,
    "stream_options": {"include_usage": True},
    "mm_processor_kwargs": {"max_pixels": 200704},
    "user": "ignored, as by OpenAI-compatible servers",
}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
WITH_TOOLS = {
    **GOOD,
    "messages": [
        *GOOD["messages"],
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c", "content": "done"},
    ],
    "tools": [TOOL],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "parallel_tool_calls": False,
}


def test_a_request_with_tools_is_valid():
    assert _request_validator().is_valid(WITH_TOOLS)


@pytest.mark.parametrize(
    "change",
    [
        {"tools": []},
        {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
        {"tools": [{"type": "retrieval"}]},
        {"tool_choice": "always"},
        {"parallel_tool_calls": "yes"},
        {"messages": [{"role": "assistant", "content": None}]},
        {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
    ],
)
def test_what_the_gateway_refuses_of_tools_is_invalid(change: dict):
    assert not _request_validator().is_valid({**WITH_TOOLS, **change})


def test_a_full_request_is_valid():
    assert _request_validator().is_valid(GOOD)


@pytest.mark.parametrize(
    "change",
    [
        {"messages": []},
        {"n": 17},
        {"unknown_field": 1},
        {"store": True},
        {"temperature": 2.5},
        {"max_tokens": 0},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stream": "yes"},
        {"top_logprobs": 21},
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
    ],
)
def test_what_the_gateway_refuses_is_invalid(change: dict):
    assert not _request_validator().is_valid({**GOOD, **change})
