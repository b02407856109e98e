"""The OpenAPI 3.1 document of the gateway's HTTP API, served at `GET /openapi.json`.

It describes what `openai_api` and `http_server` do, no more: every bound below comes
from the constant the gateway checks, tests/unit/test_openapi.py fails when the
gateway reads a request field this document does not name, and
tests/service/test_http_fuzz.py sends what it generates from it (and what it violates)
to a running gateway.
"""

from __future__ import annotations

import json

from gateway.openapi.chat import (
    _chat_request,
    _chunk,
    _completion,
    _content_parts,
    _error,
    _error_response,
    _message,
    _usage,
    logprob_schemas,
)
from gateway.openapi.common import Schema
from gateway.openapi.completions import token_schemas
from gateway.openapi.paths import OPENAPI_PATH, _paths
from gateway.openapi_tools import tool, tool_call
from tessera import __version__

__all__ = ["DOCUMENT", "DOCUMENT_JSON", "OPENAPI_PATH", "build_document"]


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
                **logprob_schemas(),
                **token_schemas(),
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
