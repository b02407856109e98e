"""What both front doors (gRPC and HTTP) share: admission (backpressure), the served
model's name, stop strings, the request metrics and the access log."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
from prometheus_client import CollectorRegistry

from gateway.access_log import AccessRecord, log_access, status_text
from gateway.metrics import FinishedRequest, GatewayMetrics
from gateway.pipeline import (
    DownstreamError,
    FinishedEvent,
    GenerationPipeline,
    GenerationRequest,
    TextEvent,
)
from gateway.prompt import ChatInput, Prompt, PromptError
from gateway.stops import StopMatcher
from gateway.tool_calls import parse_tool_calls
from tessera.hashing import framed_digest
from tessera.limits import check_cache_salt
from tessera.sampling import check_sampling
from tessera.v1 import common_pb2, decoder_pb2

if TYPE_CHECKING:  # gateway.tools imports Rejected from here
    from gateway.tools import ToolRequest

log = logging.getLogger("tessera.gateway")


class Rejected(Exception):
    """A request refused before it ran: bad input, unknown model, or too busy."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
        param: str | None = None,
        retry_after_seconds: int | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.param = param
        self.retry_after_seconds = retry_after_seconds


def tenant_salt(tenant: str, cache_salt: str) -> str:
    """The salt a request's caches go by downstream (encoder entries, Redis, prefix
    blocks): the request's own `cache_salt` without a tenant; with one, a digest of both,
    so two API keys never share an entry, even when their requests name the same salt.

    Example: tenant_salt("", "s") == "s"; tenant_salt("key-a", "") != tenant_salt("key-b", "")
    """
    if not tenant:
        return cache_salt
    return framed_digest([b"tessera-tenant", tenant.encode(), cache_salt.encode()])


@dataclass(frozen=True)
class ChatRequest:
    request_id: str
    model: str
    messages: Sequence[ChatInput]
    sampling: common_pb2.SamplingParams
    stop: Sequence[str] = ()
    max_chunk_tokens: int = 0
    cache_salt: str = ""
    timeout_seconds: float | None = None
    # Processor settings for this request's media (vLLM's mm_processor_kwargs).
    processing_options: Mapping[str, int] = field(default_factory=dict)
    # Who sent it: an id of the API key it came with ("" without keys).
    tenant: str = ""
    # The functions it offers the model (gateway/tools.py); None: no tools.
    tools: ToolRequest | None = None
    # A prompt given as token ids (/v1/completions): used instead of `messages`.
    prompt_token_ids: Sequence[int] | None = None
    protocol: str = "grpc"  # or "http": which front door, for the access log


@dataclass
class Outcome:
    """How a generation ended, for the caller's final message."""

    finish_reason: str = "length"
    prompt: Prompt | None = None
    finished: FinishedEvent | None = None
    token_ids: list[int] = field(default_factory=list)
    # Per generated token, when log-probabilities were asked for.
    logprobs: list[common_pb2.TokenLogprobs] = field(default_factory=list)


class GatewayFront:
    def __init__(
        self,
        pipeline: GenerationPipeline,
        model_names: Sequence[str],
        max_queued_requests: int,
        registry: CollectorRegistry,
        hidden_names: Sequence[str] = (),
    ):
        self.pipeline = pipeline
        # What /v1/models lists; requests may also name one of `hidden_names` (the
        # --model argument, as vLLM accepts it), which no listing shows.
        self.model_names = list(model_names)
        self.accepted_names = frozenset([*model_names, *hidden_names])
        self.max_queued_requests = max_queued_requests
        self.metrics = GatewayMetrics(registry, self.model_names[0])
        pipeline.encoded_listeners.append(self.metrics.encoder_cache)
        self._num_queued = 0

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, name: str) -> None:
        if name and name not in self.accepted_names:
            raise Rejected(
                f"model {name!r} is not served here; use {self.model_name!r}", param="model"
            )

    def refused(self, request_id: str, protocol: str, status: str) -> None:
        """A request refused before it could reach `generate` (a body that is not JSON, a
        bad request id, a wrong API key): counted and logged as any other. `status`: what
        the client got (an HTTP status, or a gRPC code's name)."""
        self.metrics.request_ended("invalid")
        log_access(AccessRecord(request_id, protocol, self.model_name, status))

    def _admit(self, request: ChatRequest) -> str:
        """Checks what can be checked up front; returns the cache salt to use downstream."""
        self.check_model(request.model)
        try:
            check_sampling(request.sampling)
        except ValueError as error:
            raise Rejected(str(error), param="sampling") from None
        try:
            cache_salt = tenant_salt(request.tenant, check_cache_salt(request.cache_salt))
        except ValueError as error:
            raise Rejected(str(error), param="cache_salt") from None
        if self._num_queued >= self.max_queued_requests:
            raise Rejected(
                f"{self._num_queued} requests are already queued; retry shortly",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                retry_after_seconds=1,
            )
        return cache_salt

    async def generate(
        self, request: ChatRequest, outcome: Outcome
    ) -> AsyncIterator[tuple[str, TextEvent]]:
        """Streams (final text, event) pairs; fills `outcome` at the end. Raises Rejected
        or DownstreamError; a client that goes away cancels it (and everything below)."""
        started = time.monotonic()
        end = RequestEnd()
        admitted = waiting = False
        last_token: float | None = None
        stops = StopMatcher(request.stop)
        # The text, kept only where tool calls are parsed: their finish is "tool_calls".
        texts: list[str] | None = [] if request.tools and request.tools.parses_calls else None
        try:
            cache_salt = self._admit(request)
            admitted = waiting = True
            self._num_queued += 1
            self.metrics.admitted()
            generation = GenerationRequest(
                GenerationPipeline.internal_id(request.request_id),
                request.messages,
                request.sampling,
                request.max_chunk_tokens,
                request.timeout_seconds,
                cache_salt,
                request.processing_options,
                request.tools.template_tools() if request.tools else (),
                request.prompt_token_ids,
            )
            # aclosing: leaving early (a stop string) cancels the decoder call at once.
            async with aclosing(self.pipeline.run(generation)) as events:
                async for event in events:
                    now = time.monotonic()
                    if isinstance(event, Prompt):
                        outcome.prompt = event
                        continue
                    if isinstance(event, FinishedEvent):
                        tail = stops.flush()
                        if tail:
                            if texts is not None:
                                texts.append(tail)
                            yield tail, TextEvent(tail, decoder_pb2.TokenBatch())
                        outcome.finished = event
                        outcome.finish_reason = _finish_reason(event)
                        break
                    if waiting:
                        waiting = False
                        self._num_queued -= 1
                        end.ttft_seconds = now - started
                        self.metrics.first_token(end.ttft_seconds)
                    elif event.tokens.token_ids and last_token is not None:
                        self.metrics.next_token(now - last_token)
                    if event.tokens.token_ids:
                        last_token = now
                        outcome.token_ids += event.tokens.token_ids
                        outcome.logprobs += event.tokens.logprobs
                    text = stops.add(event.text)
                    if texts is not None:
                        texts.append(text)
                    yield text, event
                    if stops.stopped:
                        # Our own cancel of the decoder: a stop, not an abort.
                        outcome.finish_reason = "stop"
                        break
            if texts is not None and _has_tool_calls(request.tools, "".join(texts)):
                outcome.finish_reason = "tool_calls"
            end.outcome = "ok"
        except Rejected as error:
            end.code = error.code
            busy = error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            end.outcome = "rejected" if busy else "invalid"
            raise
        except PromptError:
            end.code, end.outcome = grpc.StatusCode.INVALID_ARGUMENT, "invalid"
            raise
        except DownstreamError as error:
            end.code = error.code
            end.outcome = "invalid" if error.code == grpc.StatusCode.INVALID_ARGUMENT else "error"
            raise
        except BaseException:
            end.code, end.outcome = grpc.StatusCode.CANCELLED, "cancelled"
            raise
        finally:
            if admitted and waiting:
                self._num_queued -= 1
            end.seconds = time.monotonic() - started
            self._ended(request, outcome, end, admitted, waiting)

    def _ended(
        self, request: ChatRequest, outcome: Outcome, end: RequestEnd, admitted: bool, waiting: bool
    ) -> None:
        """Counts and logs a request that `generate` saw to its end, however it ended."""
        record = AccessRecord(
            request.request_id,
            request.protocol,
            request.model or self.model_name,
            status_text(request.protocol, end.code),
            ttft_seconds=end.ttft_seconds,
            total_seconds=end.seconds,
        )
        if outcome.prompt is not None:
            record.prompt_tokens = len(outcome.prompt.token_ids)
            record.media_items = len(outcome.prompt.items)
        record.output_tokens = len(outcome.token_ids)
        if outcome.finished is not None:
            usage = outcome.finished.decoder.usage
            record.cached_prompt_tokens = usage.cached_prompt_tokens
            record.media_items_cached = outcome.finished.sources.cached
        if admitted:
            self.metrics.left(waiting, cancelled=end.outcome == "cancelled")
            if end.outcome == "ok":
                record.finish_reason = outcome.finish_reason
                finished = FinishedRequest(
                    outcome.finish_reason,
                    record.prompt_tokens,
                    record.cached_prompt_tokens,
                    record.output_tokens,
                    end.seconds,
                )
                embedding_bytes = (
                    outcome.finished.decoder.stats.num_embedding_bytes if outcome.finished else 0
                )
                self.metrics.finished(finished, embedding_bytes)
            else:
                record.finish_reason = "abort"
                self.metrics.aborted(end.seconds)
        self.metrics.request_ended(end.outcome)
        log_access(record)


@dataclass
class RequestEnd:
    """How `generate` left a request, for its metrics and its access log line."""

    outcome: str = "error"  # ok, invalid, rejected, error, cancelled
    code: grpc.StatusCode = grpc.StatusCode.OK
    ttft_seconds: float | None = None
    seconds: float = 0.0


def _has_tool_calls(tools: ToolRequest, text: str) -> bool:
    return bool(parse_tool_calls(text, None if tools.parallel else 1).tool_calls)


def _finish_reason(event: FinishedEvent) -> str:
    reason = event.decoder.finish_reason
    return "stop" if reason == common_pb2.FINISH_REASON_STOP else "length"
