"""The OpenAPI 3.1 document of the gateway's HTTP API, served at `GET /openapi.json`.

It describes what `openai_api` and `http_server` do, no more: every bound below comes
from the constant the gateway checks, tests/unit/test_openapi.py fails when the
gateway reads a request field this document does not name, and
tests/service/test_http_fuzz.py sends what it generates from it (and what it violates)
to a running gateway.
"""

from __future__ import annotations

import json

from gateway import openai_api, sampling_body, structured
from gateway.openapi_schema import Schema, int_field, nullable, number_field, sampling_schema
from gateway.openapi_tools import (
    message_tool_fields,
    message_tool_rules,
    tool,
    tool_call,
    tool_call_delta,
    tool_request_fields,
)
from tessera import __version__
from tessera.limits import MAX_REQUEST_ID_CHARS
from tessera.placeholders import Modality
from tessera.sampling import MAX_TOP_LOGPROBS

OPENAPI_PATH = "/openapi.json"
_REF = "#/components/schemas/"


def _ref(name: str) -> Schema:
    return {"$ref": _REF + name}


def _media_url_part(kind: str, description: str) -> Schema:
    """`image_url` / `audio_url`: the URL alone, or OpenAI's `{"url": ...}` object."""
    url = {"type": "string", "minLength": 1}
    return {
        "type": "object",
        "description": description,
        "required": ["type", kind],
        "properties": {
            "type": {"const": kind},
            kind: {
                "anyOf": [
                    url,
                    {"type": "object", "required": ["url"], "properties": {"url": url}},
                ]
            },
        },
    }


def _content_parts() -> dict[str, Schema]:
    return {
        "TextPart": {
            "type": "object",
            "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        },
        "ImageURLPart": _media_url_part(
            "image_url",
            "An image as a data URL (data:image/png;base64,...) or an http(s) URL from a "
            "host in --allowed-media-domains.",
        ),
        "AudioURLPart": _media_url_part(
            "audio_url", "vLLM's audio part: a data URL or an allowed http(s) URL."
        ),
        "InputAudioPart": {
            "type": "object",
            "description": "OpenAI's audio part: the clip's bytes in base64.",
            "required": ["type", "input_audio"],
            "properties": {
                "type": {"const": "input_audio"},
                "input_audio": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {
                        "data": {
                            "type": "string",
                            "pattern": openai_api.BASE64_PATTERN,
                            "contentEncoding": "base64",
                        },
                        "format": {
                            "enum": list(openai_api.AUDIO_FORMATS),
                            "default": "wav",
                            "description": "Only names the container: the bytes are probed.",
                        },
                    },
                    # The gateway refuses other fields here (a misspelt "data" is not
                    # silently an empty clip).
                    "additionalProperties": False,
                },
            },
        },
    }


def _message() -> Schema:
    part_names = ["TextPart", "ImageURLPart", "InputAudioPart", "AudioURLPart"]
    return {
        "type": "object",
        "description": "Fields other than these are accepted and ignored.",
        "required": ["role"],
        **message_tool_rules(),
        "properties": {
            **message_tool_fields(),
            "role": {"enum": ["system", "user", "assistant", "tool"]},
            "content": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {"oneOf": [_ref(name) for name in part_names]},
                    },
                    {"type": "null", "description": "Only beside tool_calls."},
                ]
            },
        },
    }


def _chat_request() -> Schema:
    max_tokens = openai_api.MAX_TOKENS_LIMIT
    return {
        "type": "object",
        "description": (
            "OpenAI's chat-completion request, as far as the gateway implements it. Other "
            "fields are accepted and ignored, as OpenAI-compatible servers do."
        ),
        "required": ["messages"],
        "properties": {
            "messages": {"type": "array", "minItems": 1, "items": _ref("Message")},
            "model": {
                "type": "string",
                "description": "A name from GET /v1/models; empty or absent: the first one.",
            },
            "max_tokens": int_field(
                1, max_tokens, "Most tokens to generate; absent: until the context is full."
            ),
            "max_completion_tokens": int_field(
                1, max_tokens, "OpenAI's newer name for max_tokens; wins over it."
            ),
            "temperature": number_field(
                0, 2, "0 is greedy; absent: the checkpoint's default, else 0."
            ),
            "top_p": number_field(0, 1, "Nucleus sampling; 0 or absent: off."),
            "seed": int_field(0, sampling_body.MAX_SEED, "Makes sampling repeatable."),
            **sampling_schema(),
            "stop": {
                "anyOf": [
                    {"type": "string"},
                    {
                        "type": "array",
                        "items": {"type": "string"},
                        "maxItems": openai_api.MAX_STOP_STRINGS,
                    },
                    {"type": "null"},
                ],
                "description": "Generation ends where the text first contains one (cut off).",
            },
            "n": int_field(1, 1, "Only one choice per request."),
            "stream": nullable({"type": "boolean", "description": "Server-sent events."}),
            "stream_options": nullable(
                {
                    "type": "object",
                    "properties": {"include_usage": nullable({"type": "boolean"})},
                }
            ),
            "logprobs": nullable({"type": "boolean"}),
            "top_logprobs": int_field(0, MAX_TOP_LOGPROBS, "Alternatives per token."),
            "mm_processor_kwargs": nullable(
                {
                    "type": "object",
                    "description": (
                        "vLLM's processor settings for this request's media, e.g. {\"max_pixels\": "
                        "200704}; a model refuses settings it does not take."
                    ),
                    "additionalProperties": {
                        "type": ["integer", "boolean"],
                        "minimum": -(2**63),
                        "maximum": 2**63 - 1,
                    },
                }
            ),
            "max_chunk_tokens": int_field(
                0,
                openai_api.MAX_TOKENS_LIMIT,
                "Tessera: most prompt tokens per prefill step (0: the decoder's setting).",
            ),
            "cache_salt": {
                "type": "string",
                "description": "Tessera: prefix-cache entries are shared only with the same salt.",
            },
            **structured.openapi_fields(),
            **tool_request_fields(),
        },
        "additionalProperties": True,
    }


def _usage() -> Schema:
    count = {"type": "integer", "minimum": 0}
    return {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": count,
            "completion_tokens": count,
            "total_tokens": count,
            "prompt_tokens_details": {
                "type": "object",
                "properties": {"cached_tokens": count},
            },
        },
    }


_FINISH_REASON = {"enum": ["stop", "length", "tool_calls"]}


def _completion() -> Schema:
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "minItems": 1,
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "required": ["index", "message", "finish_reason"],
                    "properties": {
                        "index": {"const": 0},
                        "message": {
                            "type": "object",
                            "required": ["role", "content"],
                            "properties": {
                                "role": {"const": "assistant"},
                                "content": {"type": ["string", "null"]},
                                "tool_calls": {"type": "array", "items": _ref("ToolCall")},
                            },
                        },
                        "finish_reason": _FINISH_REASON,
                        "logprobs": {"type": "null"},
                    },
                },
            },
            "usage": _ref("Usage"),
            "tessera": {
                "type": "object",
                "description": "The generated token ids.",
                "properties": {"token_ids": {"type": "array", "items": {"type": "integer"}}},
            },
        },
    }


def _chunk() -> Schema:
    return {
        "type": "object",
        "description": "One stream event; the last before [DONE] has usage and no choices.",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion.chunk"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "maxItems": 1,
                "items": {
                    "type": "object",
                    "required": ["index", "delta", "finish_reason"],
                    "properties": {
                        "index": {"const": 0},
                        "delta": {
                            "type": "object",
                            "properties": {
                                "role": {"const": "assistant"},
                                "content": {"type": "string"},
                                "tool_calls": {"type": "array", "items": tool_call_delta()},
                            },
                        },
                        "finish_reason": {"anyOf": [_FINISH_REASON, {"type": "null"}]},
                    },
                },
            },
            "usage": _ref("Usage"),
        },
    }


def _error() -> Schema:
    return {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string", "description": "What is wrong and what to fix."},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"], "description": "The field to fix."},
            "code": {"type": ["string", "null"]},
        },
        "additionalProperties": False,
    }


def _error_response() -> Schema:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {"error": _ref("Error")},
        "additionalProperties": False,
    }


def _stream_event() -> Schema:
    """One server-sent event: `data:` is a chunk, an error (after the first token an error
    can only be an event) or the closing `[DONE]`."""
    payload = {"anyOf": [_ref("ChatCompletionChunk"), _ref("ErrorResponse")]}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": payload,
                    },
                ]
            }
        },
    }


_REQUEST_ID_HEADER = {
    "description": "The request's id: the X-Request-Id sent, or one the gateway made.",
    "schema": {"type": "string"},
}


def _json(schema: Schema, description: str, headers: dict | None = None) -> Schema:
    response: Schema = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        response["headers"] = headers
    return response


def _error_responses() -> dict[str, Schema]:
    error = _ref("ErrorResponse")
    request_id = {"X-Request-Id": _REQUEST_ID_HEADER}
    retry_after = {
        "Retry-After": {
            "description": "Seconds to wait before retrying.",
            "required": True,
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    }
    return {
        "400": _json(error, "Bad input; the message says what to fix.", request_id),
        "401": _json(
            error,
            "An API key is configured and the request has none, or an unknown one "
            '(code "invalid_api_key").',
            request_id,
        ),
        "404": _json(error, "A backend answered NOT_FOUND.", request_id),
        "413": _json(error, "The body is larger than --max-request-bytes.", request_id),
        "429": _json(
            error,
            "More than --max-queued-requests wait for their first token.",
            {**request_id, **retry_after},
        ),
        "500": _json(error, "A backend failed in a way the gateway has no status for.", request_id),
        "503": _json(error, "No backend could serve the request.", request_id),
        "504": _json(error, "The request took longer than its deadline.", request_id),
    }


def _chat_operation() -> Schema:
    return {
        "summary": "Chat completion (OpenAI-compatible), with images and audio",
        "operationId": "createChatCompletion",
        "parameters": [
            {
                "name": "X-Request-Id",
                "in": "header",
                "required": False,
                "description": "The request's id in logs and metrics; echoed back.",
                "schema": {
                    "type": "string",
                    "pattern": f"^[!-~]{{0,{MAX_REQUEST_ID_CHARS}}}$",
                },
            }
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": _ref("ChatCompletionRequest"),
                    "example": {
                        "messages": [{"role": "user", "content": "Hello"}],
                        "max_tokens": 4,
                        "temperature": 0,
                    },
                }
            },
        },
        "responses": {
            "200": {
                "description": "The completion; with stream, server-sent events ending in "
                "`data: [DONE]`.",
                "headers": {"X-Request-Id": _REQUEST_ID_HEADER},
                "content": {
                    "application/json": {"schema": _ref("ChatCompletion")},
                    "text/event-stream": {"schema": _stream_event()},
                },
            },
            **_error_responses(),
        },
    }


def _models_operation() -> Schema:
    model = {
        "type": "object",
        "required": ["id", "object", "created", "owned_by", "input_modalities"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "input_modalities": {
                "type": "array",
                "items": {"enum": ["text", *(m.value for m in Modality)]},
            },
        },
    }
    listing = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": model}},
    }
    return {
        "summary": "The served model names, with the inputs each takes",
        "operationId": "listModels",
        "responses": {
            "200": _json(listing, "The models."),
            "401": _json(_ref("ErrorResponse"), "An API key is configured and missing."),
        },
    }


def _ready_responses() -> dict[str, Schema]:
    body = {
        "type": "object",
        "required": ["ready", "backends"],
        "properties": {
            "ready": {"type": "boolean"},
            "backends": {"type": "object", "additionalProperties": {"type": "boolean"}},
        },
    }
    return {
        "200": _json(body, "Every encoder and decoder address answers SERVING."),
        "503": _json(body, "Some backend does not; `backends` says which."),
    }


def _plain_get(operation_id: str, summary: str, responses: dict[str, Schema]) -> Schema:
    # Open whatever keys the gateway has: probes and scrapers carry none.
    operation = {"summary": summary, "operationId": operation_id, "responses": responses}
    return {"get": {**operation, "security": []}}


def _paths() -> dict[str, Schema]:
    health = {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}
    metrics = {
        "description": "Prometheus text exposition.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    document = _json({"type": "object"}, "This document.")
    return {
        "/v1/chat/completions": {"post": _chat_operation()},
        "/v1/models": {"get": _models_operation()},
        "/health": _plain_get(
            "health", "The gateway's process is up", {"200": _json(health, "Up.")}
        ),
        "/ready": _plain_get("ready", "Every backend answers its health check", _ready_responses()),
        "/metrics": _plain_get("metrics", "Prometheus metrics", {"200": metrics}),
        OPENAPI_PATH: _plain_get("openapi", "This OpenAPI document", {"200": document}),
    }


def build_document() -> Schema:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera gateway",
            "version": __version__,
            "description": (
                "The OpenAI-compatible HTTP API of Tessera's gateway. Errors are "
                '{"error": {"message", "type", "param", "code"}}.'
            ),
        },
        "paths": _paths(),
        "components": {
            "schemas": {
                "ChatCompletionRequest": _chat_request(),
                "Message": _message(),
                **_content_parts(),
                "ChatCompletion": _completion(),
                "ChatCompletionChunk": _chunk(),
                "Usage": _usage(),
                "ToolCall": tool_call(),
                "Tool": tool(),
                "Error": _error(),
                "ErrorResponse": _error_response(),
            },
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "One of the gateway's --api-key keys, when it has any.",
                }
            },
        },
        # /v1 operations take a key when the gateway is given keys, and none otherwise.
        "security": [{"apiKey": []}, {}],
    }


DOCUMENT: Schema = build_document()
# Rendered once: the document never changes while the gateway runs.
DOCUMENT_JSON: bytes = json.dumps(DOCUMENT).encode()
