"""The sampling parameters every service accepts, checked in one place: the gateway
refuses them at the front door, the decoder again for callers that reach it directly.

vLLM's rules: temperature finite and >= 0, below 1e-5 it is greedy (dividing logits by
a smaller number overflows to inf and the softmax to NaN); top_p in (0, 1] (0 reads as
"unset", i.e. 1); a bounded number of top log-probabilities.
"""

from __future__ import annotations

import math

from tessera.limits import MAX_GRAMMAR_CHARS
from tessera.v1 import common_pb2

# Below this a temperature is greedy (vLLM's _SAMPLING_EPS).
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_TOP_LOGPROBS = 20
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
    check_structured_output(params.structured_output)


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
