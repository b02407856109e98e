"""The sampling parameters every service accepts, checked in one place: the gateway
refuses them at the front door, the decoder again for callers that reach it directly.

vLLM's rules: temperature finite and >= 0, below 1e-5 it is greedy (dividing logits by
a smaller number overflows to inf and the softmax to NaN); top_p in (0, 1] (0 reads as
"unset", i.e. 1); a bounded number of top log-probabilities; presence and frequency
penalties in [-2, 2]; repetition_penalty in [1/64, 2] (0 reads as unset); min_p in [0, 1];
logit_bias of at most 300 entries with values in [-100, 100]; min_tokens <= max_tokens.
Token ids of logit_bias are checked against the vocabulary by the decoder, which knows it.
"""

from __future__ import annotations

import math

from tessera.limits import MAX_GRAMMAR_CHARS
from tessera.v1 import common_pb2

# Below this a temperature is greedy (vLLM's _SAMPLING_EPS).
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_TOP_LOGPROBS = 20
MAX_PENALTY = 2.0  # presence/frequency penalties in [-MAX_PENALTY, MAX_PENALTY]
MAX_REPETITION_PENALTY = 2.0
# Smaller penalties multiply a seen token's logit past float32 (inf, then NaN draws). A
# power of two, so the float32 the proto carries is exactly the bound the gateway checks.
MIN_REPETITION_PENALTY = 1 / 64
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0
# The gateway's --max-logprobs default (vLLM's): at most MAX_TOP_LOGPROBS.
DEFAULT_MAX_LOGPROBS = 20


def check_sampling(params: common_pb2.SamplingParams) -> None:
    """Raises ValueError naming the first parameter no sampler could use."""
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if not math.isfinite(params.top_p) or not 0 <= params.top_p <= 1:
        raise ValueError(f"top_p must be in [0, 1], got {params.top_p}")
    if params.num_top_logprobs > MAX_TOP_LOGPROBS:
        raise ValueError(f"num_top_logprobs must be <= {MAX_TOP_LOGPROBS}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not math.isfinite(value) or abs(value) > MAX_PENALTY:
            raise ValueError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")
    repetition = params.repetition_penalty
    in_range = MIN_REPETITION_PENALTY <= repetition <= MAX_REPETITION_PENALTY
    if not math.isfinite(repetition) or not (repetition == 0 or in_range):
        raise ValueError(
            f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, "
            f"{MAX_REPETITION_PENALTY}] (0 = off), "
            f"got {repetition}"
        )
    if not math.isfinite(params.min_p) or not 0 <= params.min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {params.min_p}")
    _check_logit_bias(params)
    if params.max_tokens and params.min_tokens > params.max_tokens:
        raise ValueError(
            f"min_tokens ({params.min_tokens}) must be <= max_tokens ({params.max_tokens})"
        )
    check_structured_output(params.structured_output)


def _check_logit_bias(params: common_pb2.SamplingParams) -> None:
    if len(params.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"logit_bias may have at most {MAX_LOGIT_BIAS_ENTRIES} entries")
    for token_id, bias in params.logit_bias.items():
        if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
            raise ValueError(
                f"logit_bias of token {token_id} must be in [-{MAX_LOGIT_BIAS}, "
                f"{MAX_LOGIT_BIAS}], got {bias}"
            )


def check_token_ids(params: common_pb2.SamplingParams, vocab_size: int) -> None:
    """Raises ValueError when logit_bias or stop_token_ids names a token outside the
    vocabulary."""
    for name, ids in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids)):
        too_large = sorted(t for t in ids if t >= vocab_size)
        if too_large:
            raise ValueError(
                f"{name} names token {too_large[0]}, outside the vocabulary (size {vocab_size})"
            )


def check_structured_output(message: common_pb2.StructuredOutput) -> None:
    """Raises ValueError naming structured_output when its grammar is empty or too long
    (whether it compiles, only the decoder, which has the tokenizer, can tell)."""
    kind = message.WhichOneof("kind")
    if kind is None:
        return
    if kind == "json_object":
        if not message.json_object:
            raise ValueError("structured_output.json_object must be true when set")
        return
    text = getattr(message, kind)
    if not text.strip():
        raise ValueError(f"structured_output.{kind} is empty")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise ValueError(
            f"structured_output.{kind} has {len(text)} characters; at most {MAX_GRAMMAR_CHARS}"
        )


def effective_temperature(temperature: float) -> float:
    """The temperature the sampler uses: 0 (greedy) below GREEDY_BELOW_TEMPERATURE."""
    return 0.0 if temperature < GREEDY_BELOW_TEMPERATURE else temperature
