"""The operations: what each path takes and answers."""

from __future__ import annotations

from gateway.openapi.common import Schema, _ref
from tessera.limits import MAX_REQUEST_ID_CHARS
from tessera.placeholders import Modality

OPENAPI_PATH = "/openapi.json"


def _stream_event(chunk: str) -> Schema:
    """One server-sent event: `data:` is a chunk, an error (after the first token an error
    can only be an event) or the closing `[DONE]`."""
    payload = {"anyOf": [_ref(chunk), _ref("ErrorResponse")]}
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
        "415": _json(error, "The Content-Type is not application/json.", request_id),
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
    return _generation_operation(
        "Chat completion (OpenAI-compatible), with images and audio",
        "createChatCompletion",
        "ChatCompletion",
        {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0},
    )


def _generation_operation(summary: str, operation_id: str, name: str, example: dict) -> Schema:
    """POST of `{name}Request`, answered with `name` or a stream of `{name}Chunk`."""
    return {
        "summary": summary,
        "operationId": operation_id,
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
                    "schema": _ref(name + "Request"),
                    "example": example,
                }
            },
        },
        "responses": {
            "200": {
                "description": "The completion; with stream, server-sent events ending in "
                "`data: [DONE]`.",
                "headers": {"X-Request-Id": _REQUEST_ID_HEADER},
                "content": {
                    "application/json": {"schema": _ref(name)},
                    "text/event-stream": {"schema": _stream_event(name + "Chunk")},
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


_STRING = {"type": "string"}


def _tokens_operation(operation_id: str, name: str) -> Schema:
    error = _ref("ErrorResponse")
    body = {"application/json": {"schema": _ref(name + "Request")}}
    return {
        "summary": f"vLLM's /{operation_id}",
        "operationId": operation_id,
        "requestBody": {"required": True, "content": body},
        "responses": {
            "200": _json(_ref(name + "Response"), "The result."),
            "400": _json(error, "Bad input; the message says what to fix."),
            "401": _json(error, "An API key is configured and missing."),
            "413": _json(error, "The body is larger than --max-request-bytes."),
            "415": _json(error, "The Content-Type is not application/json."),
        },
    }


def _paths() -> dict[str, Schema]:
    health = {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}
    metrics = {
        "description": "Prometheus text exposition.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    document = _json({"type": "object"}, "This document.")
    version = {"type": "object", "required": ["version"], "properties": {"version": _STRING}}
    return {
        "/v1/chat/completions": {"post": _chat_operation()},
        "/v1/completions": {
            "post": _generation_operation(
                "Text completion (OpenAI's legacy API): a string or token-id prompt",
                "createCompletion",
                "Completion",
                {"prompt": "Hello", "max_tokens": 4, "temperature": 0},
            )
        },
        "/tokenize": {"post": _tokens_operation("tokenize", "Tokenize")},
        "/detokenize": {"post": _tokens_operation("detokenize", "Detokenize")},
        "/version": _plain_get("version", "The Tessera version", {"200": _json(version, "It.")}),
        "/v1/models": {"get": _models_operation()},
        "/health": _plain_get(
            "health", "The gateway's process is up", {"200": _json(health, "Up.")}
        ),
        "/ready": _plain_get("ready", "Every backend answers its health check", _ready_responses()),
        "/metrics": _plain_get("metrics", "Prometheus metrics", {"200": metrics}),
        OPENAPI_PATH: _plain_get("openapi", "This OpenAPI document", {"200": document}),
    }
