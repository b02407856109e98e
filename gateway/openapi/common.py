"""Helpers the OpenAPI modules share."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_REF = "#/components/schemas/"


def _ref(name: str) -> Schema:
    return {"$ref": _REF + name}


def _nullable(schema: Schema) -> Schema:
    """OpenAI's optional fields take null for "unset", as the gateway does."""
    return {**schema, "type": [schema["type"], "null"]}


def _integer(low: int, high: int, description: str) -> Schema:
    return _nullable(
        {"type": "integer", "minimum": low, "maximum": high, "description": description}
    )


def _number(low: float, high: float, description: str) -> Schema:
    return _nullable(
        {"type": "number", "minimum": low, "maximum": high, "description": description}
    )
