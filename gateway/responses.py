"""Chat-completion responses and stream chunks for one or more choices, in OpenAI's shape."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.choices import CollectedChoice
from gateway.front import Outcome
from gateway.logprobs import LogprobsRequest, TokenText, chat_logprobs
from gateway.tool_calls import HermesStream, PlainStream, output_stream, parse_tool_calls
from gateway.tools import ToolRequest
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
    """Chat answers for one request's choices. With tools whose calls are parsed, each
    choice's text goes through its own hermes parser: content until a call opens, then
    `tool_calls` (and finish_reason "tool_calls")."""

    request_id: str
    model: str
    logprobs: LogprobsRequest
    token_text: TokenText
    tools: ToolRequest | None = None
    # Per choice index, the stream parser of its text (streaming answers only).
    _outputs: dict[int, HermesStream | PlainStream] = field(default_factory=dict)

    @property
    def _parses_calls(self) -> bool:
        return bool(self.tools and self.tools.parses_calls)

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

    def _message(self, choice: CollectedChoice) -> tuple[dict, str | None]:
        message: dict = {"role": "assistant", "content": choice.text}
        finish_reason = choice.outcome.finish_reason
        if self._parses_calls:
            parsed = parse_tool_calls(choice.text, None if self.tools.parallel else 1)
            message["content"] = parsed.content
            if parsed.tool_calls:
                message["tool_calls"] = [call.to_dict() for call in parsed.tool_calls]
                finish_reason = "tool_calls"
        return message, finish_reason

    def response(self, choices: Sequence[CollectedChoice]) -> dict:
        outcomes = [choice.outcome for choice in choices]
        answers = []
        for index, choice in enumerate(choices):
            message, finish_reason = self._message(choice)
            answers.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": finish_reason,
                    "logprobs": self._logprobs(choice.outcome.logprobs),
                }
            )
        return {
            **self._envelope("chat.completion"),
            "choices": answers,
            "usage": usage(outcomes),
            "tessera": tessera_extension(outcomes),
        }

    def chunks(
        self,
        index: int,
        text: str | None,
        entries: Sequence[common_pb2.TokenLogprobs] = (),
        first: bool = False,
        finish_reason: str | None = None,
    ) -> list[dict]:
        """The stream chunks for one piece of a choice's text (or its end). The parser
        may hold text back (a tag not yet closed), so a piece can make no delta; its
        logprobs still go out, on an empty delta."""
        output = self._outputs.setdefault(
            index, output_stream(self._parses_calls, not self.tools or self.tools.parallel)
        )
        deltas = output.feed(text) if text is not None else []
        if finish_reason is not None:
            deltas += output.finish()
            if output.num_calls:
                finish_reason = "tool_calls"
        if not deltas and (first or finish_reason is None):
            deltas = [{}]
        chunks = []
        for number, delta in enumerate(deltas):
            delta = {"role": "assistant", **delta} if first and number == 0 else delta
            choice: dict = {"index": index, "delta": delta, "finish_reason": None}
            if self.logprobs.enabled and number == 0 and finish_reason is None:
                choice["logprobs"] = self._logprobs(entries)
            chunks.append({**self._envelope("chat.completion.chunk"), "choices": [choice]})
        if finish_reason is not None:
            end = {"index": index, "delta": {}, "finish_reason": finish_reason}
            chunks.append({**self._envelope("chat.completion.chunk"), "choices": [end]})
        return chunks

    def usage_chunk(self, outcomes: Sequence[Outcome]) -> dict:
        return {
            **self._envelope("chat.completion.chunk"),
            "choices": [],
            "usage": usage(outcomes),
        }
