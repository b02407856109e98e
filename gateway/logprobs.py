"""Log-probabilities in OpenAI's chat shape: `choices[i].logprobs.content[]`, each entry
the sampled token with its log-probability, UTF-8 bytes and the `top_logprobs` most likely
alternatives (most likely first), from the decoder's per-token TokenLogprobs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.front import Rejected
from tessera.sampling import DEFAULT_MAX_LOGPROBS
from tessera.v1 import common_pb2

__all__ = ["DEFAULT_MAX_LOGPROBS", "LogprobsRequest", "chat_logprobs", "completion_logprobs"]

TokenText = Callable[[int], str]


@dataclass(frozen=True)
class LogprobsRequest:
    """What a request asked for: whether to return log-probabilities, and how many of the
    most likely alternatives at each step (0: only the sampled token)."""

    enabled: bool = False
    top: int = 0


def logprobs_request(logprobs: object, top_logprobs: object, max_logprobs: int) -> LogprobsRequest:
    """Chat's `logprobs` (true/false) and `top_logprobs` (0..max_logprobs, only with
    `logprobs: true`, as OpenAI and vLLM require)."""
    if logprobs is not None and not isinstance(logprobs, bool):
        raise Rejected("logprobs must be true or false", param="logprobs")
    if top_logprobs is None:
        return LogprobsRequest(bool(logprobs), 0)
    whole = isinstance(top_logprobs, int) or (
        isinstance(top_logprobs, float) and top_logprobs.is_integer()
    )
    if isinstance(top_logprobs, bool) or not whole or not 0 <= top_logprobs <= max_logprobs:
        raise Rejected(
            f"top_logprobs must be an integer in [0, {max_logprobs}] (--max-logprobs)",
            param="top_logprobs",
        )
    if not logprobs:
        raise Rejected("top_logprobs needs logprobs: true", param="top_logprobs")
    return LogprobsRequest(True, int(top_logprobs))


def num_top_logprobs(request: LogprobsRequest) -> int:
    """What to ask the decoder for: it returns the sampled token's log-probability only
    beside a top list, so at least one."""
    return max(1, request.top) if request.enabled else 0


def _entry(token_id: int, logprob: float, token_text: TokenText) -> dict:
    text = token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    entries: Sequence[common_pb2.TokenLogprobs], top: int, token_text: TokenText
) -> dict:
    """`{"content": [...]}` for the generated tokens `entries`."""
    content = []
    for entry in entries:
        shaped = _entry(entry.token_id, entry.logprob, token_text)
        shaped["top_logprobs"] = [
            _entry(alternative.token_id, alternative.logprob, token_text)
            for alternative in entry.top[:top]
        ]
        content.append(shaped)
    return {"content": content}


def completion_logprobs(
    entries: Sequence[common_pb2.TokenLogprobs], top: int, token_text: TokenText, offset: int
) -> dict:
    """The legacy completions shape: parallel lists, `top_logprobs` one {token: logprob}
    per position, `text_offset` where each token starts in the choice's text (from
    `offset`, the characters before these tokens)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        text = token_text(entry.token_id)
        tokens.append(text)
        token_logprobs.append(entry.logprob)
        tops.append({token_text(a.token_id): a.logprob for a in entry.top[:top]})
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
