"""Structured outputs on the HTTP API: OpenAI's `response_format` and vLLM's
`guided_json` / `guided_regex`, mapped to a StructuredOutput proto (compiled and applied
as a token mask by the decoder, decoder_service/grammar.py). Every problem is a
`Rejected` naming the field."""

from __future__ import annotations

import json
from typing import Any

from gateway.front import Rejected
from tessera.grammar_spec import grammar_error
from tessera.limits import MAX_GRAMMAR_CHARS
from tessera.v1 import common_pb2

Schema = dict[str, Any]

# vLLM's other ways to ask for a grammar: refused by name rather than ignored.
UNSUPPORTED_FIELDS = (
    "structured_outputs",
    "guided_grammar",
    "guided_choice",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
)
_JSON_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})
MAX_SCHEMA_NAME_CHARS = 64


def structured_output_from_body(body: dict) -> common_pb2.StructuredOutput | None:
    """The grammar a chat request asks for, or None for free text."""
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) is not None:
            raise Rejected(
                f"{name} is not supported; use response_format (json_object or json_schema) "
                "or guided_json / guided_regex",
                param=name,
            )
    asked = [
        name
        for name in ("response_format", "guided_json", "guided_regex")
        if body.get(name) is not None
    ]
    if not asked:
        return None
    if len(asked) > 1:
        raise Rejected(f"give only one of {', '.join(asked)}", param=asked[1])
    if asked[0] == "guided_regex":
        output = _regex(body["guided_regex"])
    elif asked[0] == "guided_json":
        output = _schema(_guided_json(body["guided_json"]), "guided_json")
    else:
        output = _response_format(body["response_format"])
    # Checked here, so a bad schema is a 400 naming the request's field (the decoder
    # checks again against its tokenizer).
    error = grammar_error(output) if output is not None else ""
    if error:
        kind = output.WhichOneof("kind")
        raise Rejected(f"{asked[0]} is not a usable {kind} grammar: {error}", param=asked[0])
    return output


def _response_format(value: Any) -> common_pb2.StructuredOutput | None:
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(value, dict) or value.get("type") not in kinds:
        raise Rejected(
            'response_format must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
            param="response_format",
        )
    kind = value["type"]
    allowed = {"type", kind} if kind == "json_schema" else {"type"}
    _no_other_keys(value, allowed, "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return common_pb2.StructuredOutput(json_object=True)
    spec = value.get("json_schema")
    param = "response_format.json_schema"
    if not isinstance(spec, dict):
        raise Rejected(f"{param} must be an object with name and schema", param=param)
    _no_other_keys(spec, _JSON_SCHEMA_KEYS, param)
    name = spec.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_SCHEMA_NAME_CHARS:
        raise Rejected(
            f"{param}.name must be a string of 1 to {MAX_SCHEMA_NAME_CHARS} characters",
            param=f"{param}.name",
        )
    for key, kinds_ in (("strict", bool), ("description", str)):
        if spec.get(key) is not None and not isinstance(spec[key], kinds_):
            raise Rejected(f"{param}.{key} must be a {kinds_.__name__}", param=f"{param}.{key}")
    return _schema(spec.get("schema"), f"{param}.schema")


def _guided_json(value: Any) -> Any:
    """vLLM takes the schema as an object or as its JSON text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as error:
            raise Rejected(f"guided_json is not JSON: {error}", param="guided_json") from None
    return value


def _schema(schema: Any, param: str) -> common_pb2.StructuredOutput:
    # A JSON Schema is an object or a boolean (true: anything; false: nothing).
    if not isinstance(schema, (dict, bool)):
        raise Rejected(f"{param} must be a JSON Schema object", param=param)
    text = json.dumps(schema, separators=(",", ":"))
    _bounded(text, param)
    return common_pb2.StructuredOutput(json_schema=text)


def _regex(value: Any) -> common_pb2.StructuredOutput:
    if not isinstance(value, str) or not value:
        raise Rejected("guided_regex must be a non-empty string", param="guided_regex")
    _bounded(value, "guided_regex")
    return common_pb2.StructuredOutput(regex=value)


def _bounded(text: str, param: str) -> None:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise Rejected(
            f"{param} has {len(text)} characters as JSON; at most {MAX_GRAMMAR_CHARS}",
            param=param,
        )


def _no_other_keys(value: dict, allowed: set | frozenset, param: str) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise Rejected(f"{param} takes {sorted(allowed)}, not {unknown}", param=param)


# -- the OpenAPI document ---------------------------------------------------------------


def _response_format_schema() -> Schema:
    json_schema = {
        "type": "object",
        "required": ["name", "schema"],
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": MAX_SCHEMA_NAME_CHARS},
            "schema": {
                "type": ["object", "boolean"],
                "description": (
                    f"A JSON Schema, at most {MAX_GRAMMAR_CHARS} characters as JSON; one the "
                    "grammar compiler refuses is a 400."
                ),
            },
            "strict": {"type": ["boolean", "null"]},
            "description": {"type": ["string", "null"]},
        },
        "additionalProperties": False,
    }
    return {
        "description": (
            "The output follows a grammar, applied as a token mask while sampling: "
            '{"type": "text"} (free text), {"type": "json_object"} (one JSON object) or '
            '{"type": "json_schema", "json_schema": {"name", "schema"}} (JSON that '
            "validates against the schema). The finish reason is stop when the grammar is "
            "complete, length when max_tokens cut it."
        ),
        "anyOf": [
            {"type": "null"},
            {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"enum": ["text", "json_object"]}},
                "additionalProperties": False,
            },
            {
                "type": "object",
                "required": ["type", "json_schema"],
                "properties": {"type": {"const": "json_schema"}, "json_schema": json_schema},
                "additionalProperties": False,
            },
        ],
    }


def openapi_fields() -> dict[str, Schema]:
    """The request fields above in the OpenAPI document (gateway/openapi.py)."""
    refused = ", ".join(UNSUPPORTED_FIELDS)
    return {
        "response_format": _response_format_schema(),
        "guided_json": {
            "type": ["object", "boolean", "string", "null"],
            "description": (
                "vLLM's: a JSON Schema (or its text) the output validates against; only one of "
                f"response_format, guided_json, guided_regex. vLLM's {refused} are refused."
            ),
        },
        "guided_regex": {
            "type": ["string", "null"],
            "minLength": 1,
            "maxLength": MAX_GRAMMAR_CHARS,
            "description": "vLLM's: a regular expression the whole output matches.",
        },
    }
