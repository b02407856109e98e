"""`POST /v1/completions`: OpenAI's legacy text completions. The prompt is a string
(tokenized without special tokens, no chat template) or a list of token ids; lists of
prompts are refused. `echo` puts the prompt before each choice's text; `logprobs` (an
integer) returns the sampled tokens' log-probabilities and that many alternatives."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway import fields
from gateway.choices import CollectedChoice, check_n
from gateway.fields import check_fields
from gateway.front import ChatRequest, Outcome, Rejected
from gateway.generation_defaults import NEUTRAL, SamplingDefaults
from gateway.logprobs import LogprobsRequest, TokenText, completion_logprobs
from gateway.openai_api import request_basics, sampling_from_body, stops_from_body, stream_settings
from gateway.responses import usage
from tessera.v1 import common_pb2

# OpenAI's (and vLLM's) default for completions, unlike chat's "until the context is full".
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class CompletionsBody:
    chat: ChatRequest
    n: int
    logprobs: LogprobsRequest
    echo: bool
    stream: bool
    include_usage: bool


def _logprobs(value: object, max_logprobs: int) -> LogprobsRequest:
    if value is None:
        return LogprobsRequest()
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or not 0 <= value <= max_logprobs:
        raise Rejected(
            f"logprobs must be an integer in [0, {max_logprobs}] (--max-logprobs)",
            param="logprobs",
        )
    return LogprobsRequest(True, int(value))


def prompt_token_ids(prompt: object, tokenize: Callable[[str], list[int]]) -> list[int]:
    """A string, or a non-empty list of token ids."""
    if isinstance(prompt, str) and prompt:
        return tokenize(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    raise Rejected(
        "prompt must be a non-empty string or a non-empty list of token ids "
        "(lists of prompts are not supported: send one request per prompt)",
        param="prompt",
    )


def completions_body(
    body: object,
    request_id: str,
    timeout_seconds: float,
    max_logprobs: int,
    tokenize: Callable[[str], list[int]],
    defaults: SamplingDefaults = NEUTRAL,
) -> CompletionsBody:
    check_fields(body, fields.COMPLETIONS)
    model, salt = request_basics(body)
    logprobs = _logprobs(body.get("logprobs"), max_logprobs)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise Rejected("echo must be true or false", param="echo")
    if echo and logprobs.enabled:
        # The decoder computes log-probabilities of generated tokens only.
        raise Rejected(
            "echo with logprobs (prompt log-probabilities) is not supported", param="echo"
        )
    sampling = sampling_from_body(body, logprobs, defaults)
    if body.get("max_tokens") is None:
        sampling.max_tokens = DEFAULT_MAX_TOKENS
    chat = ChatRequest(
        request_id=request_id,
        model=model,
        messages=(),
        sampling=sampling,
        stop=stops_from_body(body),
        cache_salt=salt,
        timeout_seconds=timeout_seconds,
        prompt_token_ids=prompt_token_ids(body.get("prompt"), tokenize),
    )
    stream, include_usage = stream_settings(body)
    n = check_n(body.get("n"), sampling.max_tokens)
    return CompletionsBody(chat, n, logprobs, bool(echo), stream, include_usage)


@dataclass
class CompletionShape:
    request_id: str
    model: str
    logprobs: LogprobsRequest
    token_text: TokenText
    decode: Callable[[Sequence[int]], str]
    echo: bool
    prompt_token_ids: Sequence[int] = ()
    # Per streamed choice: characters sent so far (text_offset continues from there).
    _sent: dict[int, int] = field(default_factory=dict)

    def _envelope(self) -> dict:
        return {
            "id": f"cmpl-{self.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
        }

    def _echoed(self) -> str:
        return self.decode(self.prompt_token_ids) if self.echo else ""

    def _logprobs(self, entries: Sequence[common_pb2.TokenLogprobs], offset: int) -> dict | None:
        if not self.logprobs.enabled:
            return None
        return completion_logprobs(entries, self.logprobs.top, self.token_text, offset)

    def response(self, choices: Sequence[CollectedChoice]) -> dict:
        prefix = self._echoed()
        return {
            **self._envelope(),
            "choices": [
                {
                    "index": index,
                    "text": prefix + choice.text,
                    "logprobs": self._logprobs(choice.outcome.logprobs, len(prefix)),
                    "finish_reason": choice.outcome.finish_reason,
                }
                for index, choice in enumerate(choices)
            ],
            "usage": usage([choice.outcome for choice in choices]),
        }

    def chunk(
        self,
        index: int,
        text: str | None,
        entries: Sequence[common_pb2.TokenLogprobs] = (),
        first: bool = False,
        finish_reason: str | None = None,
    ) -> dict:
        text = (self._echoed() if first else "") + (text or "")
        offset = self._sent.get(index, 0)
        self._sent[index] = offset + len(text)
        choice = {
            "index": index,
            "text": text,
            "logprobs": None if finish_reason else self._logprobs(entries, offset),
            "finish_reason": finish_reason,
        }
        return {**self._envelope(), "choices": [choice]}

    def chunks(
        self,
        index: int,
        text: str | None,
        entries: Sequence[common_pb2.TokenLogprobs] = (),
        first: bool = False,
        finish_reason: str | None = None,
    ) -> list[dict]:
        if finish_reason is not None and first:  # no text at all: the echo still comes first
            return [
                self.chunk(index, None, first=True),
                self.chunk(index, None, (), False, finish_reason),
            ]
        return [self.chunk(index, text, entries, first, finish_reason)]

    def usage_chunk(self, outcomes: Sequence[Outcome]) -> dict:
        return {**self._envelope(), "choices": [], "usage": usage(outcomes)}
