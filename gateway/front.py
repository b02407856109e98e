"""What both front doors (gRPC and HTTP) share: admission (backpressure), the served
model's name, stop strings, and the request metrics."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.pipeline import (
    DownstreamError,
    FinishedEvent,
    GenerationPipeline,
    GenerationRequest,
    TextEvent,
)
from gateway.prompt import ChatInput, Prompt, PromptError
from gateway.stops import StopMatcher
from tessera.hashing import framed_digest
from tessera.limits import check_cache_salt
from tessera.sampling import check_sampling
from tessera.v1 import common_pb2, decoder_pb2

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
    # A prompt given as token ids (/v1/completions): used instead of `messages`.
    prompt_token_ids: Sequence[int] | None = None


@dataclass
class Outcome:
    """How a generation ended, for the caller's final message."""

    finish_reason: str = "length"
    prompt: Prompt | None = None
    finished: FinishedEvent | None = None
    token_ids: list[int] = field(default_factory=list)
    # Per generated token, when log-probabilities were asked for.
    logprobs: list[common_pb2.TokenLogprobs] = field(default_factory=list)


class RequestMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "tessera_gateway_requests", "Requests by outcome", ["outcome"], registry=registry
        )
        self.ttft = Histogram(
            "tessera_gateway_time_to_first_token_seconds", "Time to first token", registry=registry
        )
        self.itl = Histogram(
            "tessera_gateway_inter_token_latency_seconds",
            "Time between tokens",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=registry,
        )
        self.e2e = Histogram(
            "tessera_gateway_request_seconds", "End-to-end request latency", registry=registry
        )
        self.queued = Gauge(
            "tessera_gateway_queued_requests",
            "Requests waiting for a first token",
            registry=registry,
        )
        self.running = Gauge(
            "tessera_gateway_running_requests", "Requests in flight", registry=registry
        )
        self.embedding_bytes = Counter(
            "tessera_gateway_embedding_bytes_received",
            "Embedding bytes the decoders received for finished requests",
            registry=registry,
        )
        self.cancellations = Counter(
            "tessera_gateway_cancellations", "Requests the client abandoned", registry=registry
        )


class GatewayFront:
    def __init__(
        self,
        pipeline: GenerationPipeline,
        model_names: Sequence[str],
        max_queued_requests: int,
        registry: CollectorRegistry,
    ):
        self.pipeline = pipeline
        self.model_names = list(model_names)
        self.max_queued_requests = max_queued_requests
        self.metrics = RequestMetrics(registry)
        self._num_queued = 0

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, name: str) -> None:
        if name and name not in self.model_names:
            raise Rejected(
                f"model {name!r} is not served here; use {self.model_name!r}", param="model"
            )

    async def generate(
        self, request: ChatRequest, outcome: Outcome
    ) -> AsyncIterator[tuple[str, TextEvent]]:
        """Streams (final text, event) pairs; fills `outcome` at the end. Raises Rejected
        or DownstreamError; a client that goes away cancels it (and everything below)."""
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
            self.metrics.requests.labels("rejected").inc()
            raise Rejected(
                f"{self._num_queued} requests are already queued; retry shortly",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                retry_after_seconds=1,
            )
        started = time.monotonic()
        last_token: float | None = None
        stops = StopMatcher(request.stop)
        self._num_queued += 1
        queued = True
        self.metrics.queued.inc()
        self.metrics.running.inc()
        result = "error"
        try:
            generation = GenerationRequest(
                GenerationPipeline.internal_id(request.request_id),
                request.messages,
                request.sampling,
                request.max_chunk_tokens,
                request.timeout_seconds,
                cache_salt,
                request.processing_options,
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
                            yield tail, TextEvent(tail, decoder_pb2.TokenBatch())
                        outcome.finished = event
                        outcome.finish_reason = _finish_reason(event)
                        break
                    if queued:
                        queued = False
                        self._num_queued -= 1
                        self.metrics.queued.dec()
                        self.metrics.ttft.observe(now - started)
                    elif event.tokens.token_ids and last_token is not None:
                        self.metrics.itl.observe(now - last_token)
                    if event.tokens.token_ids:
                        last_token = now
                        outcome.token_ids += event.tokens.token_ids
                        outcome.logprobs += event.tokens.logprobs
                    yield stops.add(event.text), event
                    if stops.stopped:
                        outcome.finish_reason = "stop"
                        break
            result = "ok"
            if outcome.finished is not None:
                self.metrics.embedding_bytes.inc(outcome.finished.decoder.stats.num_embedding_bytes)
        except (PromptError, Rejected):
            result = "invalid"
            raise
        except DownstreamError as error:
            result = "invalid" if error.code == grpc.StatusCode.INVALID_ARGUMENT else "error"
            raise
        except BaseException:
            result = "cancelled"
            self.metrics.cancellations.inc()
            raise
        finally:
            if queued:
                self._num_queued -= 1
                self.metrics.queued.dec()
            self.metrics.running.dec()
            self.metrics.requests.labels(result).inc()
            self.metrics.e2e.observe(time.monotonic() - started)


def _finish_reason(event: FinishedEvent) -> str:
    reason = event.decoder.finish_reason
    return "stop" if reason == common_pb2.FINISH_REASON_STOP else "length"
