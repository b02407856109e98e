"""JSON Schema pieces of the OpenAPI document (gateway/openapi.py): the nullable scalar
helpers, and the sampling fields beyond OpenAI's basic ones."""

from __future__ import annotations

from typing import Any

from gateway import sampling_body
from tessera.sampling import (
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
)

Schema = dict[str, Any]


def nullable(schema: Schema) -> Schema:
    """OpenAI's optional fields take null for "unset", as the gateway does."""
    return {**schema, "type": [schema["type"], "null"]}


def int_field(low: int, high: int, description: str) -> Schema:
    return nullable(
        {"type": "integer", "minimum": low, "maximum": high, "description": description}
    )


def number_field(low: float, high: float, description: str) -> Schema:
    return nullable({"type": "number", "minimum": low, "maximum": high, "description": description})


def sampling_schema() -> Schema:
    """OpenAI's penalties and logit_bias, and vLLM's extra sampling fields. temperature,
    top_p, top_k, min_p and repetition_penalty default to the checkpoint's
    generation_config when the gateway runs with --generation-config auto."""
    token_id = {"type": "integer", "minimum": 0, "maximum": sampling_body.MAX_TOKEN_ID}
    return {
        "top_k": int_field(
            -1, sampling_body.MAX_TOP_K, "Keep the k most likely tokens; -1 or 0: off."
        ),
        "min_p": number_field(0, 1, "Drop tokens below min_p times the top token's probability."),
        "presence_penalty": number_field(
            -MAX_PENALTY, MAX_PENALTY, "Subtracted once from each token already generated."
        ),
        "frequency_penalty": number_field(
            -MAX_PENALTY, MAX_PENALTY, "Subtracted per occurrence of a generated token."
        ),
        "repetition_penalty": nullable(
            {
                "type": "number",
                "minimum": MIN_REPETITION_PENALTY,
                "maximum": MAX_REPETITION_PENALTY,
                "description": "HF's repetition penalty over prompt and output; 1: off.",
            }
        ),
        "logit_bias": nullable(
            {
                "type": "object",
                "description": "Token ids (as strings) to biases added to their logits.",
                "maxProperties": MAX_LOGIT_BIAS_ENTRIES,
                "propertyNames": {"pattern": "^[0-9]{1,10}$"},
                "additionalProperties": {
                    "type": "number",
                    "minimum": -MAX_LOGIT_BIAS,
                    "maximum": MAX_LOGIT_BIAS,
                },
            }
        ),
        "stop_token_ids": nullable(
            {
                "type": "array",
                "items": token_id,
                "maxItems": sampling_body.MAX_STOP_TOKEN_IDS,
                "description": "Generation stops after any of these tokens.",
            }
        ),
        "min_tokens": int_field(
            0, sampling_body.MAX_TOKENS_LIMIT, "EOS and stop_token_ids cannot stop before this."
        ),
        "ignore_eos": nullable(
            {"type": "boolean", "description": "Keep generating past the model's EOS token."}
        ),
    }
