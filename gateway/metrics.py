"""The gateway's Prometheus metrics, named as vLLM's where the concept is the same
(`vllm:<suffix>` -> `tessera_gateway_<suffix>`), each with the served model's
`model_name` label. docs/metrics.md lists every one and the vLLM metric it matches."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.pipeline import ItemSources

# vLLM's finished_reason values; a request that ends any other way (an error, a client
# that hung up) is "abort".
FINISHED_REASONS = ("stop", "length", "tool_calls", "abort")
ENCODER_CACHE_TIERS = ("memory", "redis")
# How a request ended at the gateway (tessera_gateway_requests_total's `outcome`).
OUTCOMES = ("ok", "invalid", "rejected", "error", "cancelled")
# vLLM's request-latency buckets (seconds), for TTFT and end-to-end latency alike.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5)


@dataclass(frozen=True)
class FinishedRequest:
    """What a finished generation adds to the counters."""

    finished_reason: str
    prompt_tokens: int
    cached_prompt_tokens: int  # found in the decoder's prefix cache
    generation_tokens: int
    e2e_seconds: float


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        self.model_name = model_name
        model = ["model_name"]
        self._requests = Counter(
            "tessera_gateway_requests",
            "Requests by outcome: ok, invalid (refused as bad input), rejected (too busy), "
            "error (a backend failed), cancelled (the client left)",
            [*model, "outcome"],
            registry=registry,
        )
        self._success = Counter(
            "tessera_gateway_request_success",
            "Requests that ran, by finished_reason (stop, length, tool_calls, abort)",
            [*model, "finished_reason"],
            registry=registry,
        )
        self._prompt_tokens = Counter(
            "tessera_gateway_prompt_tokens",
            "Prompt tokens of requests that ran",
            model,
            registry=registry,
        )
        self._prompt_tokens_cached = Counter(
            "tessera_gateway_prompt_tokens_cached",
            "Prompt tokens of requests that ran, found in a decoder's prefix cache",
            model,
            registry=registry,
        )
        self._generation_tokens = Counter(
            "tessera_gateway_generation_tokens", "Tokens generated", model, registry=registry
        )
        self._ttft = Histogram(
            "tessera_gateway_time_to_first_token_seconds",
            "Time from a request's arrival to its first token",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._itl = Histogram(
            "tessera_gateway_inter_token_latency_seconds",
            "Time between two token batches of a request",
            model,
            buckets=_ITL_BUCKETS,
            registry=registry,
        )
        self._e2e = Histogram(
            "tessera_gateway_e2e_request_latency_seconds",
            "Time from a request's arrival to its end",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._waiting = Gauge(
            "tessera_gateway_num_requests_waiting",
            "Requests admitted and waiting for their first token",
            model,
            registry=registry,
        )
        self._running = Gauge(
            "tessera_gateway_num_requests_running", "Requests in flight", model, registry=registry
        )
        self._embedding_bytes = Counter(
            "tessera_gateway_embedding_bytes_received",
            "Embedding bytes the decoders received for finished requests",
            model,
            registry=registry,
        )
        self._cancellations = Counter(
            "tessera_gateway_cancellations",
            "Requests the client abandoned",
            model,
            registry=registry,
        )
        self._encoder_queries = Counter(
            "tessera_gateway_encoder_cache_queries",
            "Media items looked up in an encoder cache tier (redis: those memory missed)",
            [*model, "tier"],
            registry=registry,
        )
        self._encoder_hits = Counter(
            "tessera_gateway_encoder_cache_hits",
            "Media items an encoder cache tier served",
            [*model, "tier"],
            registry=registry,
        )
        # Every label value exists from the start: a dashboard's rate() sees 0, not nothing.
        for metric in (
            self._prompt_tokens,
            self._prompt_tokens_cached,
            self._generation_tokens,
            self._ttft,
            self._itl,
            self._e2e,
            self._waiting,
            self._running,
            self._embedding_bytes,
            self._cancellations,
        ):
            metric.labels(model_name)
        for outcome in OUTCOMES:
            self._requests.labels(model_name, outcome)
        for reason in FINISHED_REASONS:
            self._success.labels(model_name, reason)
        for tier in ENCODER_CACHE_TIERS:
            self._encoder_queries.labels(model_name, tier)
            self._encoder_hits.labels(model_name, tier)

    def request_ended(self, outcome: str) -> None:
        self._requests.labels(self.model_name, outcome).inc()

    def admitted(self) -> None:
        self._waiting.labels(self.model_name).inc()
        self._running.labels(self.model_name).inc()

    def first_token(self, seconds: float) -> None:
        self._waiting.labels(self.model_name).dec()
        self._ttft.labels(self.model_name).observe(seconds)

    def next_token(self, seconds: float) -> None:
        self._itl.labels(self.model_name).observe(seconds)

    def left(self, waiting: bool, cancelled: bool) -> None:
        """A request admitted earlier is over (`waiting`: before its first token)."""
        if waiting:
            self._waiting.labels(self.model_name).dec()
        self._running.labels(self.model_name).dec()
        if cancelled:
            self._cancellations.labels(self.model_name).inc()

    def aborted(self, e2e_seconds: float) -> None:
        """An admitted request that did not finish (error or client gone)."""
        self._success.labels(self.model_name, "abort").inc()
        self._e2e.labels(self.model_name).observe(e2e_seconds)

    def finished(self, request: FinishedRequest, embedding_bytes: int) -> None:
        model = self.model_name
        self._success.labels(model, request.finished_reason).inc()
        self._prompt_tokens.labels(model).inc(request.prompt_tokens)
        self._prompt_tokens_cached.labels(model).inc(request.cached_prompt_tokens)
        self._generation_tokens.labels(model).inc(request.generation_tokens)
        self._e2e.labels(model).observe(request.e2e_seconds)
        self._embedding_bytes.labels(model).inc(embedding_bytes)

    def encoder_cache(self, sources: ItemSources) -> None:
        """Counted when a request's Encode answers, however the request ends. Every item
        asks the memory tier; those it misses ask Redis (counted so even on an encoder
        without Redis, where that tier never hits)."""
        model = self.model_name
        self._encoder_queries.labels(model, "memory").inc(
            sources.memory + sources.redis + sources.computed
        )
        self._encoder_hits.labels(model, "memory").inc(sources.memory)
        self._encoder_queries.labels(model, "redis").inc(sources.redis + sources.computed)
        self._encoder_hits.labels(model, "redis").inc(sources.redis)
