"""Schemas of /v1/completions, /tokenize and /detokenize."""

from __future__ import annotations

from gateway import openai_api, sampling_body
from gateway.choices import MAX_CHOICES, MAX_TOTAL_TOKENS
from gateway.completions_api import DEFAULT_MAX_TOKENS
from gateway.openapi.chat import _FINISH_REASON, _INDEX, _TOKEN_IDS, _nullable_ref
from gateway.openapi.common import Schema, _integer, _nullable, _number, _ref
from tessera.sampling import MAX_TOP_LOGPROBS

_TOKEN_ID_LIST = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_MODEL = {"type": "string", "description": "A name from GET /v1/models; empty: the first."}


def _completion_request() -> Schema:
    return {
        "type": "object",
        "description": "OpenAI's legacy completion request; any other field is refused.",
        "required": ["prompt"],
        "properties": {
            "model": _MODEL,
            "prompt": {
                "anyOf": [{"type": "string", "minLength": 1}, _TOKEN_ID_LIST],
                "description": "Text (no chat template, no special tokens added) or token ids.",
            },
            "max_tokens": _integer(
                1,
                openai_api.MAX_TOKENS_LIMIT,
                f"Most tokens to generate (default {DEFAULT_MAX_TOKENS}).",
            ),
            "temperature": _number(0, 2, "0 (the default) is greedy."),
            "top_p": _number(0, 1, "Nucleus sampling; 0 or absent: off."),
            "seed": _integer(0, sampling_body.MAX_SEED, "Makes sampling repeatable."),
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
            },
            "n": _integer(1, MAX_CHOICES, f"Choices; n * max_tokens at most {MAX_TOTAL_TOKENS}."),
            "echo": _nullable({"type": "boolean", "description": "The prompt before the text."}),
            "logprobs": _integer(
                0,
                MAX_TOP_LOGPROBS,
                "Alternatives per token (at most --max-logprobs); not with echo.",
            ),
            "stream": _nullable({"type": "boolean"}),
            "stream_options": _nullable(
                {
                    "type": "object",
                    "properties": {"include_usage": _nullable({"type": "boolean"})},
                    "additionalProperties": False,
                }
            ),
            "cache_salt": {"type": "string"},
            "user": _nullable({"type": "string", "description": "Ignored."}),
        },
        "additionalProperties": False,
    }


def _completion_logprobs() -> Schema:
    return {
        "type": "object",
        "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
        "properties": {
            "tokens": {"type": "array", "items": {"type": "string"}},
            "token_logprobs": {"type": "array", "items": {"type": "number"}},
            "top_logprobs": {
                "type": "array",
                "items": {"type": "object", "additionalProperties": {"type": "number"}},
            },
            "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        },
    }


def _completion(kind: str, finish_reason: Schema, min_choices: int) -> Schema:
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "text_completion"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "minItems": min_choices,
                "maxItems": MAX_CHOICES,
                "items": {
                    "type": "object",
                    "required": ["index", "text", "finish_reason", "logprobs"],
                    "properties": {
                        "index": _INDEX,
                        "text": {"type": "string"},
                        "logprobs": _nullable_ref("CompletionLogprobs"),
                        "finish_reason": finish_reason,
                    },
                },
            },
            "usage": _ref("Usage"),
        },
        "description": kind,
    }


def _tokenize_request() -> Schema:
    return {
        "type": "object",
        "description": "Exactly one of prompt and messages.",
        "properties": {
            "model": _MODEL,
            "prompt": {"type": "string"},
            "messages": {"type": "array", "minItems": 1, "items": _ref("Message")},
        },
        "oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}],
        "additionalProperties": False,
    }


def token_schemas() -> dict[str, Schema]:
    count = {"type": "integer", "minimum": 0}
    return {
        "CompletionRequest": _completion_request(),
        "Completion": _completion("The completion.", _FINISH_REASON, 1),
        "CompletionChunk": _completion(
            "One stream event; the last before [DONE] may have usage and no choices.",
            {"anyOf": [_FINISH_REASON, {"type": "null"}]},
            0,
        ),
        "CompletionLogprobs": _completion_logprobs(),
        "TokenizeRequest": _tokenize_request(),
        "TokenizeResponse": {
            "type": "object",
            "required": ["tokens", "count", "max_model_len"],
            "properties": {"tokens": _TOKEN_IDS, "count": count, "max_model_len": count},
        },
        "DetokenizeRequest": {
            "type": "object",
            "required": ["tokens"],
            "properties": {"model": _MODEL, "tokens": _TOKEN_IDS},
            "additionalProperties": False,
        },
        "DetokenizeResponse": {
            "type": "object",
            "required": ["prompt"],
            "properties": {"prompt": {"type": "string"}},
        },
    }
