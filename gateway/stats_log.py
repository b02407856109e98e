"""A periodic stats line, as vLLM's (`--log-stats-interval` seconds, 0: off):

    Avg prompt throughput: 120.0 tokens/s, Avg generation throughput: 30.5 tokens/s,
    Running: 2 reqs, Waiting: 0 reqs, KV cache usage: 12.5%, Prefix cache hit rate: 40.0%,
    Encoder cache hit rate: 66.7% (memory 50.0%, redis 33.3%)

Throughputs and hit rates are over the interval, from the gateway's own metrics; running,
waiting and KV usage are the decoders' (GetStats), summed, or the gateway's own running
and waiting counts when no decoder answers. Nothing is logged for an idle interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry

from tessera.v1 import decoder_pb2, decoder_pb2_grpc

log = logging.getLogger("tessera.gateway.stats")


@dataclass(frozen=True)
class Snapshot:
    """The gateway's cumulative counters at one moment."""

    at: float  # time.monotonic()
    requests: float = 0.0  # ended, any outcome
    prompt_tokens: float = 0.0
    cached_prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    memory_queries: float = 0.0
    memory_hits: float = 0.0
    redis_queries: float = 0.0
    redis_hits: float = 0.0
    running: float = 0.0
    waiting: float = 0.0


def take_snapshot(registry: CollectorRegistry, model_name: str, at: float) -> Snapshot:
    def value(name: str, **labels: str) -> float:
        found = registry.get_sample_value(name, {"model_name": model_name, **labels})
        return found or 0.0

    requests = sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "tessera_gateway_requests"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )
    return Snapshot(
        at=at,
        requests=requests,
        prompt_tokens=value("tessera_gateway_prompt_tokens_total"),
        cached_prompt_tokens=value("tessera_gateway_prompt_tokens_cached_total"),
        generation_tokens=value("tessera_gateway_generation_tokens_total"),
        memory_queries=value("tessera_gateway_encoder_cache_queries_total", tier="memory"),
        memory_hits=value("tessera_gateway_encoder_cache_hits_total", tier="memory"),
        redis_queries=value("tessera_gateway_encoder_cache_queries_total", tier="redis"),
        redis_hits=value("tessera_gateway_encoder_cache_hits_total", tier="redis"),
        running=value("tessera_gateway_num_requests_running"),
        waiting=value("tessera_gateway_num_requests_waiting"),
    )


def _percent(hits: float, queries: float) -> float:
    return 100.0 * hits / queries if queries else 0.0


def stats_line(
    before: Snapshot, now: Snapshot, decoders: Sequence[decoder_pb2.DecoderStats]
) -> str | None:
    """The line for the interval from `before` to `now`; None when nothing happened in
    it and nothing is running."""
    running = sum(d.num_running for d in decoders) if decoders else now.running
    waiting = sum(d.num_waiting for d in decoders) if decoders else now.waiting
    if now.requests == before.requests and not running and not waiting:
        return None
    seconds = max(now.at - before.at, 1e-9)
    blocks = sum(d.num_kv_blocks for d in decoders)
    used = sum(d.num_kv_blocks - d.num_free_kv_blocks for d in decoders)
    prompt = now.prompt_tokens - before.prompt_tokens
    memory_queries = now.memory_queries - before.memory_queries
    memory_hits = now.memory_hits - before.memory_hits
    redis_hits = now.redis_hits - before.redis_hits
    memory = _percent(memory_hits, memory_queries)
    redis = _percent(redis_hits, now.redis_queries - before.redis_queries)
    return (
        f"Avg prompt throughput: {prompt / seconds:.1f} tokens/s, "
        f"Avg generation throughput: "
        f"{(now.generation_tokens - before.generation_tokens) / seconds:.1f} tokens/s, "
        f"Running: {running:.0f} reqs, Waiting: {waiting:.0f} reqs, "
        f"KV cache usage: {_percent(used, blocks):.1f}%, "
        f"Prefix cache hit rate: "
        f"{_percent(now.cached_prompt_tokens - before.cached_prompt_tokens, prompt):.1f}%, "
        f"Encoder cache hit rate: {_percent(memory_hits + redis_hits, memory_queries):.1f}% "
        f"(memory {memory:.1f}%, redis {redis:.1f}%)"
    )


class StatsLogger:
    """Logs `stats_line` every `interval` seconds; `log_once` is one such tick."""

    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        decoder_stats: Callable[[], Awaitable[list[decoder_pb2.DecoderStats]]],
    ):
        self.registry = registry
        self.model_name = model_name
        self.decoder_stats = decoder_stats
        self._last = take_snapshot(registry, model_name, time.monotonic())

    async def log_once(self) -> str | None:
        decoders = await self.decoder_stats()
        now = take_snapshot(self.registry, self.model_name, time.monotonic())
        line = stats_line(self._last, now, decoders)
        self._last = now
        if line is not None:
            log.info(line)
        return line

    async def run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.log_once()
            except Exception:  # a stats line is never worth the gateway
                log.exception("stats line failed")


async def decoders_stats(
    addresses: Sequence[str], channel_for: Callable[[str], grpc.aio.Channel]
) -> list[decoder_pb2.DecoderStats]:
    """GetStats of every decoder that answers within a second (the others are left out:
    a stats line never waits on a sick decoder)."""

    async def one(address: str) -> decoder_pb2.DecoderStats | None:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel_for(address))
        try:
            return await stub.GetStats(decoder_pb2.GetDecoderStatsRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return None

    answers = await asyncio.gather(*(one(a) for a in addresses))
    return [a for a in answers if a is not None]
