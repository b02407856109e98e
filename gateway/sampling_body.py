"""The sampling fields of an OpenAI/vLLM request body, checked and turned into
SamplingParams. Every problem is a `Rejected` naming the field (`param`) to fix."""

from __future__ import annotations

from typing import Any

from gateway.front import Rejected
from gateway.generation_defaults import NEUTRAL, SamplingDefaults
from gateway.structured import structured_output_from_body
from tessera.sampling import (
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_REPETITION_PENALTY,
    MIN_REPETITION_PENALTY,
)
from tessera.v1 import common_pb2

# Bounds the gateway checks, and the OpenAPI document (gateway/openapi.py) states.
MAX_TOKENS_LIMIT = 1 << 20
MAX_SEED = 2**63 - 1
MAX_TOKEN_ID = 2**32 - 1  # the decoder checks ids against its vocabulary
MAX_TOP_K = 2**31 - 1
MAX_STOP_TOKEN_IDS = 64


def require(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise Rejected(message, param=param)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    require(
        _is_number(value) and low <= value <= high,
        f"{name} must be a number in [{low}, {high}]",
        name,
    )
    return float(value)


def _is_whole(value: Any) -> bool:
    """2.0 counts (JSON does not tell it from 2), and neither 2.5 nor true does."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return whole and not isinstance(value, bool)


def integer(body: dict, name: str, low: int, high: int, message: str = "") -> int | None:
    """An integer field; null is unset."""
    value = body.get(name)
    if value is None:
        return None
    require(
        _is_whole(value) and low <= value <= high,
        message or f"{name} must be an integer in [{low}, {high}]",
        name,
    )
    return int(value)


def boolean(body: dict, name: str, param: str = "") -> bool:
    """A boolean field; null is false. Only true and false: "no" would be truthy."""
    value = body.get(name)
    require(
        value is None or isinstance(value, bool),
        f"{param or name} must be true or false",
        param or name,
    )
    return bool(value)


def sampling_from_body(
    body: dict, defaults: SamplingDefaults = NEUTRAL
) -> common_pb2.SamplingParams:
    """`defaults` fill the fields the body leaves unset (from the checkpoint's
    generation_config, with --generation-config auto)."""
    # Both are checked; max_completion_tokens (OpenAI's newer name) wins unless it is null.
    max_tokens = integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    max_completion_tokens = integer(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    sampling = common_pb2.SamplingParams(
        max_tokens=max_completion_tokens or max_tokens or 0,
        temperature=_or(number(body, "temperature", 0, 2), defaults.temperature),
        top_p=_or(number(body, "top_p", 0, 1), defaults.top_p),
        top_k=_top_k(body, defaults),
        min_p=_or(number(body, "min_p", 0, 1), defaults.min_p),
        presence_penalty=number(body, "presence_penalty", -MAX_PENALTY, MAX_PENALTY) or 0.0,
        frequency_penalty=number(body, "frequency_penalty", -MAX_PENALTY, MAX_PENALTY) or 0.0,
        repetition_penalty=_or(_repetition_penalty(body), defaults.repetition_penalty),
        stop_token_ids=_stop_token_ids(body),
        min_tokens=_min_tokens(body, max_completion_tokens or max_tokens),
        ignore_eos=boolean(body, "ignore_eos"),
    )
    sampling.logit_bias.update(_logit_bias(body))
    seed = integer(body, "seed", 0, MAX_SEED)
    if seed is not None:
        sampling.seed = seed
    # logprobs and top_logprobs are each endpoint's own (gateway/logprobs.py): a bool for
    # chat, an int for completions.
    structured = structured_output_from_body(body)
    if structured is not None:
        sampling.structured_output.CopyFrom(structured)
    return sampling


def _or(value: float | None, default: float | None) -> float:
    """The request's value, else the default, else 0 (the proto's "unset")."""
    if value is not None:
        return value
    return default if default is not None else 0.0


def _top_k(body: dict, defaults: SamplingDefaults) -> int:
    """vLLM's top_k: -1 or 0 is off."""
    value = integer(body, "top_k", -1, MAX_TOP_K)
    if value is None:
        return defaults.top_k or 0
    return max(value, 0)


def _repetition_penalty(body: dict) -> float | None:
    value = body.get("repetition_penalty")
    if value is None:
        return None
    require(
        _is_number(value) and MIN_REPETITION_PENALTY <= value <= MAX_REPETITION_PENALTY,
        f"repetition_penalty must be a number in [{MIN_REPETITION_PENALTY}, "
        f"{MAX_REPETITION_PENALTY}] (1: off)",
        "repetition_penalty",
    )
    return float(value)


def _stop_token_ids(body: dict) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    require(
        isinstance(ids, list)
        and len(ids) <= MAX_STOP_TOKEN_IDS
        and all(_is_whole(i) and 0 <= i <= MAX_TOKEN_ID for i in ids),
        f"stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} token ids",
        "stop_token_ids",
    )
    return [int(i) for i in ids]


def _min_tokens(body: dict, max_tokens: int | None) -> int:
    value = integer(body, "min_tokens", 0, MAX_TOKENS_LIMIT) or 0
    require(
        max_tokens is None or value <= max_tokens,
        f"min_tokens ({value}) must be <= max_tokens ({max_tokens})",
        "min_tokens",
    )
    return value


def _logit_bias(body: dict) -> dict[int, float]:
    """OpenAI's logit_bias: an object of token ids (as strings) to biases."""
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    require(
        isinstance(bias, dict) and len(bias) <= MAX_LOGIT_BIAS_ENTRIES,
        f"logit_bias must be an object of at most {MAX_LOGIT_BIAS_ENTRIES} token ids to numbers",
        "logit_bias",
    )
    parsed: dict[int, float] = {}
    for key, value in bias.items():
        require(
            key.isascii() and key.isdigit() and int(key) <= MAX_TOKEN_ID,
            f"logit_bias key {key!r} must be a token id",
            "logit_bias",
        )
        require(
            _is_number(value) and -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS,
            f"logit_bias of token {key} must be a number in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]",
            "logit_bias",
        )
        parsed[int(key)] = float(value)
    return parsed
