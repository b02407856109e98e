"""The chat-completion schemas: request, message, content parts, response, chunk, error."""

from __future__ import annotations

from gateway import openai_api, sampling_body, structured
from gateway.choices import MAX_CHOICES, MAX_TOTAL_TOKENS
from gateway.openapi.common import Schema, _integer, _nullable, _ref
from gateway.openapi_schema import int_field, nullable, number_field, sampling_schema
from gateway.openapi_tools import (
    message_tool_fields,
    message_tool_rules,
    tool_call_delta,
    tool_request_fields,
)
from tessera.sampling import MAX_TOP_LOGPROBS

_INDEX = {"type": "integer", "minimum": 0, "maximum": MAX_CHOICES - 1}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}


def _nullable_ref(name: str) -> Schema:
    return {"anyOf": [_ref(name), {"type": "null"}]}


def _no_op_fields() -> Schema:
    """gateway/fields.py's CHAT_NO_OPS: accepted and ignored, only harmless values."""
    return {
        "user": _nullable({"type": "string", "description": "Ignored (OpenAI's abuse id)."}),
        "metadata": _nullable(
            {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Ignored.",
            }
        ),
        "store": {"enum": [False, None], "description": "Completions are not stored here."},
        "service_tier": {"enum": ["auto", "default", None], "description": "One tier here."},
    }


def logprob_schemas() -> dict[str, Schema]:
    entry = {
        "type": "object",
        "required": ["token", "logprob", "bytes"],
        "properties": {
            "token": {"type": "string"},
            "logprob": {"type": "number"},
            "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
        },
    }
    with_top = {
        **entry,
        "required": [*entry["required"], "top_logprobs"],
        "properties": {
            **entry["properties"],
            "top_logprobs": {"type": "array", "maxItems": MAX_TOP_LOGPROBS, "items": entry},
        },
    }
    return {
        "ChatLogprobs": {
            "type": "object",
            "description": "Per generated token: its log-probability and the most likely "
            "alternatives, most likely first.",
            "required": ["content"],
            "properties": {"content": {"type": "array", "items": with_top}},
        }
    }


def _media_url_part(kind: str, description: str) -> Schema:
    """`image_url` / `audio_url` / `video_url`: the URL alone, or OpenAI's `{"url": ...}` object."""
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
        "VideoURLPart": _media_url_part(
            "video_url",
            "vLLM's video part (MP4, WebM, Matroska, QuickTime): a data URL "
            "(data:video/mp4;base64,...) or an allowed http(s) URL.",
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
    part_names = ["TextPart", "ImageURLPart", "InputAudioPart", "AudioURLPart", "VideoURLPart"]
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
            "OpenAI's chat-completion request, as far as the gateway implements it. Any "
            "other field is refused (400 naming it)."
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
            "n": _integer(
                1,
                MAX_CHOICES,
                f"Choices; n * max_tokens at most {MAX_TOTAL_TOKENS}. Choice i samples with "
                "seed + i.",
            ),
            "stream": _nullable({"type": "boolean", "description": "Server-sent events."}),
            "stream_options": _nullable(
                {
                    "type": "object",
                    "properties": {"include_usage": nullable({"type": "boolean"})},
                }
            ),
            "logprobs": _nullable({"type": "boolean"}),
            "top_logprobs": _integer(
                0,
                MAX_TOP_LOGPROBS,
                "Alternatives per token, with logprobs: true; at most --max-logprobs.",
            ),
            **_no_op_fields(),
            "mm_processor_kwargs": _nullable(
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
        "additionalProperties": False,
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
                "maxItems": MAX_CHOICES,
                "items": {
                    "type": "object",
                    "required": ["index", "message", "finish_reason"],
                    "properties": {
                        "index": _INDEX,
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
                        "logprobs": _nullable_ref("ChatLogprobs"),
                    },
                },
            },
            "usage": _ref("Usage"),
            "tessera": {
                "type": "object",
                "description": "The generated token ids (choice 0's), and per choice its ids "
                "and cached prompt tokens.",
                "properties": {
                    "token_ids": _TOKEN_IDS,
                    "choices": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "token_ids": _TOKEN_IDS,
                                "cached_tokens": {"type": "integer", "minimum": 0},
                            },
                        },
                    },
                },
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
                        "index": _INDEX,
                        "logprobs": _nullable_ref("ChatLogprobs"),
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
