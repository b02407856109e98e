"""Chat-completion responses and stream chunks for one or more choices, in OpenAI's shape."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.choices import CollectedChoice
from gateway.front import Outcome
from gateway.logprobs import LogprobsRequest, TokenText, chat_logprobs
from tessera.v1 import common_pb2


def usage(outcomes: Sequence[Outcome]) -> dict:
    """The prompt once (every choice has the same one), the completions summed."""
    leader = outcomes[0]
    prompt_tokens = len(leader.prompt.token_ids) if leader.prompt else 0
    cached = leader.finished.decoder.usage.cached_prompt_tokens if leader.finished else 0
    completion_tokens = sum(len(outcome.token_ids) for outcome in outcomes)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def tessera_extension(outcomes: Sequence[Outcome]) -> dict:
    """Tessera's additions: the token ids (choice 0's at the top, as before n) and, per
    choice, its ids and its cached prompt tokens (followers share the leader's blocks)."""
    return {
        "token_ids": outcomes[0].token_ids,
        "choices": [
            {
                "token_ids": outcome.token_ids,
                "cached_tokens": (
                    outcome.finished.decoder.usage.cached_prompt_tokens if outcome.finished else 0
                ),
            }
            for outcome in outcomes
        ],
    }


@dataclass(frozen=True)
class ChatShape:
    request_id: str
    model: str
    logprobs: LogprobsRequest
    token_text: TokenText

    def _envelope(self, kind: str) -> dict:
        return {
            "id": f"chatcmpl-{self.request_id}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
        }

    def _logprobs(self, entries: Sequence[common_pb2.TokenLogprobs]) -> dict | None:
        if not self.logprobs.enabled:
            return None
        return chat_logprobs(entries, self.logprobs.top, self.token_text)

    def response(self, choices: Sequence[CollectedChoice]) -> dict:
        outcomes = [choice.outcome for choice in choices]
        return {
            **self._envelope("chat.completion"),
            "choices": [
                {
                    "index": index,
                    "message": {"role": "assistant", "content": choice.text},
                    "finish_reason": choice.outcome.finish_reason,
                    "logprobs": self._logprobs(choice.outcome.logprobs),
                }
                for index, choice in enumerate(choices)
            ],
            "usage": usage(outcomes),
            "tessera": tessera_extension(outcomes),
        }

    def chunk(
        self,
        index: int,
        text: str | None,
        entries: Sequence[common_pb2.TokenLogprobs] = (),
        first: bool = False,
        finish_reason: str | None = None,
    ) -> dict:
        delta: dict = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
        if self.logprobs.enabled and finish_reason is None:
            choice["logprobs"] = self._logprobs(entries)
        return {**self._envelope("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, outcomes: Sequence[Outcome]) -> dict:
        return {
            **self._envelope("chat.completion.chunk"),
            "choices": [],
            "usage": usage(outcomes),
        }
