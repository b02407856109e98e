"""Which body fields each HTTP endpoint accepts. A field the gateway does not implement is
refused with a 400 naming it, never silently ignored; an unknown field (a typo) likewise.

Per field, one of:
- implemented: parsed and applied by the endpoint's parser.
- no-op: OpenAI defines it as not changing the generated answer (bookkeeping for OpenAI's
  own platform), so it is accepted and ignored, as vLLM does; only its harmless values.
- refused: known to OpenAI, not implemented here; the 400 says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gateway.front import Rejected
from gateway.structured import UNSUPPORTED_FIELDS

# Chat fields parsed in gateway/openai_api.py, gateway/logprobs.py, gateway/structured.py.
_CHAT_BASE_FIELDS = frozenset(
    {
        "model",
        "messages",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "mm_processor_kwargs",
        "max_chunk_tokens",
        "cache_salt",
        # gateway/structured.py
        "response_format",
        "guided_json",
        "guided_regex",
    }
)
# Parsed on the branches that implement them (issue 14: sampler, structured, tools);
# listed here so that merging them is adding their parsing, nothing else.
# gateway/sampling_body.py (chat and completions alike).
SAMPLING_FIELDS = frozenset(
    {
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "top_k",
        "min_p",
        "logit_bias",
        "stop_token_ids",
        "min_tokens",
        "ignore_eos",
    }
)
# gateway/tools.py (chat only).
TOOL_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls"})
CHAT_IMPLEMENTED = _CHAT_BASE_FIELDS | SAMPLING_FIELDS | TOOL_FIELDS


def _not_stored(value: object) -> bool:
    # store: true asks OpenAI to keep the completion for evals/distillation; nothing here
    # keeps it, so only "do not store" is honest.
    return value is None or value is False


def _default_tier(value: object) -> bool:
    return value in (None, "auto", "default")


def _string(value: object) -> bool:
    return value is None or isinstance(value, str)


def _string_map(value: object) -> bool:
    return value is None or (
        isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    )


@dataclass(frozen=True)
class NoOp:
    """An accepted-and-ignored field, and the values for which ignoring it is honest."""

    allowed: Callable[[object], bool]
    expects: str


CHAT_NO_OPS: Mapping[str, NoOp] = {
    # An end-user id for OpenAI's abuse monitoring.
    "user": NoOp(_string, "a string"),
    # Tags for OpenAI's stored-completions dashboard.
    "metadata": NoOp(_string_map, "an object of strings"),
    "store": NoOp(_not_stored, "false (completions are not stored here)"),
    "service_tier": NoOp(_default_tier, '"auto" or "default" (there is one tier here)'),
}
# Known to OpenAI, not implemented: the reason the 400 gives.
CHAT_REFUSED: Mapping[str, str] = {
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "functions is deprecated by OpenAI and not supported; use tools",
    "function_call": "function_call is deprecated by OpenAI and not supported; use tool_choice",
    "reasoning_effort": "reasoning_effort is not supported",
    "verbosity": "verbosity is not supported",
    "prompt_cache_key": "prompt_cache_key is not supported; use cache_salt",
    "safety_identifier": "safety_identifier is not supported",
    # vLLM's other ways to ask for a grammar.
    **{
        name: f"{name} is not supported; use response_format (json_object or json_schema)"
        for name in UNSUPPORTED_FIELDS
    },
}
CHAT_ACCEPTED = CHAT_IMPLEMENTED | frozenset(CHAT_NO_OPS)

COMPLETIONS_IMPLEMENTED = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "echo",
        "logprobs",
        "n",
        "cache_salt",
    }
)
COMPLETIONS_NO_OPS: Mapping[str, NoOp] = {"user": CHAT_NO_OPS["user"]}
COMPLETIONS_REFUSED: Mapping[str, str] = {
    "suffix": "suffix (insertion) is not supported",
    "best_of": "best_of is not supported; use n",
}
COMPLETIONS_ACCEPTED = COMPLETIONS_IMPLEMENTED | frozenset(COMPLETIONS_NO_OPS) | SAMPLING_FIELDS


@dataclass(frozen=True)
class EndpointFields:
    accepted: frozenset[str]
    no_ops: Mapping[str, NoOp]
    refused: Mapping[str, str]


CHAT = EndpointFields(CHAT_ACCEPTED, CHAT_NO_OPS, CHAT_REFUSED)
COMPLETIONS = EndpointFields(COMPLETIONS_ACCEPTED, COMPLETIONS_NO_OPS, COMPLETIONS_REFUSED)
TOKENIZE = EndpointFields(frozenset({"model", "prompt", "messages"}), {}, {})
DETOKENIZE = EndpointFields(frozenset({"model", "tokens"}), {}, {})


def check_fields(body: object, fields: EndpointFields) -> None:
    """Raises Rejected naming the first field (in sorted order) that is refused, unknown,
    or a no-op with a value that would not be one."""
    if not isinstance(body, dict):
        raise Rejected("the body must be a JSON object", param="body")
    for name in sorted(body, key=str):
        if name in fields.refused:
            raise Rejected(f"{name}: {fields.refused[name]}", param=name)
        if name not in fields.accepted:
            raise Rejected(f"unknown field {name!r}", param=name)
        no_op = fields.no_ops.get(name)
        if no_op is not None and not no_op.allowed(body[name]):
            raise Rejected(f"{name} must be {no_op.expects}", param=name)
