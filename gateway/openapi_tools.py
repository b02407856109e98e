"""The OpenAPI document's parts for function calling (gateway/tools.py and
gateway/tool_calls.py), kept apart from gateway/openapi.py."""

from __future__ import annotations

from typing import Any

from gateway import tools

Schema = dict[str, Any]
_REF = "#/components/schemas/"


def _ref(name: str) -> Schema:
    return {"$ref": _REF + name}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def tool() -> Schema:
    return {
        "type": "object",
        "required": ["type", "function"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": tools.NAME_PATTERN.pattern},
                    "description": {"type": "string", "maxLength": tools.MAX_DESCRIPTION_CHARS},
                    "parameters": {
                        "type": "object",
                        "description": "A JSON Schema of the arguments (absent: any object).",
                    },
                    "strict": _nullable({"type": "boolean"}),
                },
            },
        },
    }


def tool_request_fields() -> dict[str, Schema]:
    named = {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}},
            },
        },
    }
    return {
        "tools": _nullable(
            {
                "type": "array",
                "minItems": 1,
                "maxItems": tools.MAX_TOOLS,
                "items": _ref("Tool"),
                "description": "Functions the model may call; the chat template lists them.",
            }
        ),
        "tool_choice": {
            "anyOf": [{"enum": list(tools.TOOL_CHOICES)}, named, {"type": "null"}],
            "description": (
                'Default "auto" with tools (needs the server\'s --enable-auto-tool-choice): the '
                'model decides and calls are parsed from its output; "required" or a named '
                "function: a call is forced by structured decoding (not with response_format); "
                '"none": the tools are still in the prompt, calls are not parsed (as vLLM).'
            ),
        },
        "parallel_tool_calls": _nullable(
            {
                "type": "boolean",
                "description": "false: at most one call (forced, or the first one parsed).",
            }
        ),
    }


def message_tool_fields() -> dict[str, Schema]:
    call = {
        "type": "object",
        "required": ["function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "arguments": {"type": "string", "description": "A JSON object's text."},
                },
            },
        },
    }
    return {
        "tool_calls": {
            "type": "array",
            "maxItems": tools.MAX_HISTORY_CALLS,
            "items": call,
            "description": "An assistant message's calls.",
        },
        "tool_call_id": {"type": "string", "minLength": 1, "description": "A tool message's."},
    }


def message_tool_rules() -> Schema:
    """A tool message names its call; content may be null only beside tool_calls."""
    has_content = {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}
    return {
        "allOf": [
            {
                "if": {"properties": {"role": {"const": "tool"}}},
                "then": {"required": ["tool_call_id"]},
                "else": {"not": {"required": ["tool_call_id"]}},
            },
            {"anyOf": [has_content, {"required": ["tool_calls"]}]},
        ]
    }


def tool_call() -> Schema:
    return {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {
                    "name": {"type": "string"},
                    "arguments": {"type": "string", "description": "A JSON object's text."},
                },
            },
        },
    }


def tool_call_delta() -> Schema:
    """The first delta of a call has its id, type and name; later ones its arguments."""
    return {
        "type": "object",
        "required": ["index"],
        "properties": {
            "index": {"type": "integer", "minimum": 0},
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
            },
        },
    }
