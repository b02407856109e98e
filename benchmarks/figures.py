"""Figures of one arm on one workload, and the statistics they are built from."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from benchmarks.outcome import Outcome


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator or math.isnan(denominator):
        return None
    return numerator / denominator


@dataclass
class ArmFigures:
    arm: str
    num_requests: int = 0
    wall_seconds: float = 0.0
    num_output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    encoder_passes: int | None = None
    embedding_bytes: int | None = None
    minimum_bytes: int | None = None
    forward_seconds: float | None = None
    fetch_wait_seconds: float | None = None
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    # CPU seconds by process: each service's over the cell, and the benchmark process's
    # ("client" for a service arm, "process" for an in-process one) over the arm's turns.
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    num_near_ties: int = 0
    num_unique_items: int = 0
    # Per-request fetch waits (ms) of requests whose images were all cached (warm) and
    # of requests that had an image computed (cold: the wait includes encoding).
    fetch_wait_warm_ms: list[float] = field(default_factory=list)
    fetch_wait_cold_ms: list[float] = field(default_factory=list)

    def add(self, outcomes: list[Outcome], wall_seconds: float) -> None:
        self.num_requests += len(outcomes)
        self.wall_seconds += wall_seconds
        for outcome in outcomes:
            self.num_output_tokens += len(outcome.token_ids)
            self.ttft_s.append(outcome.ttft_s)
            self.itl_s += outcome.itl_s
            self.latency_s.append(outcome.latency_s)
            if outcome.encoder_passes is not None:
                self.encoder_passes = (self.encoder_passes or 0) + outcome.encoder_passes
            if outcome.items_computed is not None:
                cold = outcome.items_computed > 0
                waits = self.fetch_wait_cold_ms if cold else self.fetch_wait_warm_ms
                waits.append(outcome.fetch_wait_ms)

    def add_bytes(self, received: int, minimum: int) -> None:
        self.embedding_bytes = (self.embedding_bytes or 0) + received
        self.minimum_bytes = (self.minimum_bytes or 0) + minimum

    def add_cpu(self, role: str, seconds: float) -> None:
        self.cpu_seconds[role] = self.cpu_seconds.get(role, 0.0) + seconds

    # -- the figures ---------------------------------------------------------------------

    @property
    def cpu_ms_per_request(self) -> dict[str, float]:
        if not self.num_requests:
            return {}
        return {role: s * 1000 / self.num_requests for role, s in self.cpu_seconds.items()}

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.wall_seconds if self.wall_seconds else float("nan")

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.wall_seconds if self.wall_seconds else float("nan")

    @property
    def passes_per_unique_item(self) -> float | None:
        return ratio(self.encoder_passes, self.num_unique_items)

    @property
    def bytes_over_minimum(self) -> float | None:
        if self.embedding_bytes is None:
            return None
        if not self.minimum_bytes:
            return 1.0 if self.embedding_bytes == 0 else float("inf")
        return self.embedding_bytes / self.minimum_bytes

    @property
    def fetch_wait_fraction(self) -> float | None:
        """Time the decoder's forward waited on embeddings / its busy time (forward time
        plus that wait)."""
        if self.fetch_wait_seconds is None or self.forward_seconds is None:
            return None
        return ratio(self.fetch_wait_seconds, self.forward_seconds + self.fetch_wait_seconds)

    def summary(self) -> dict[str, object]:
        ms = 1000
        return {
            "arm": self.arm,
            "requests": self.num_requests,
            "wall_s": self.wall_seconds,
            "requests_per_s": self.requests_per_s,
            "output_tokens_per_s": self.tokens_per_s,
            "ttft_p50_ms": median(self.ttft_s) * ms,
            "ttft_p99_ms": percentile(self.ttft_s, 99) * ms,
            "itl_p50_ms": median(self.itl_s) * ms,
            "itl_p99_ms": percentile(self.itl_s, 99) * ms,
            "latency_p50_ms": median(self.latency_s) * ms,
            "latency_p99_ms": percentile(self.latency_s, 99) * ms,
            "encoder_passes": self.encoder_passes,
            "unique_items": self.num_unique_items,
            "encoder_passes_per_unique_item": self.passes_per_unique_item,
            "embedding_bytes": self.embedding_bytes,
            "minimum_embedding_bytes": self.minimum_bytes,
            "embedding_bytes_over_minimum": self.bytes_over_minimum,
            "forward_seconds": self.forward_seconds,
            "fetch_wait_seconds": self.fetch_wait_seconds,
            "fetch_wait_fraction": self.fetch_wait_fraction,
            "request_fetch_wait_warm_ms_p50": median(self.fetch_wait_warm_ms),
            "request_fetch_wait_cold_ms_p50": median(self.fetch_wait_cold_ms),
            "requests_warm": len(self.fetch_wait_warm_ms),
            "peak_rss_mb": self.peak_rss_mb,
            "cpu_ms_per_request": self.cpu_ms_per_request,
            "near_ties": self.num_near_ties,
        }


@dataclass
class CellResult:
    """Every arm on one workload."""

    name: str
    description: str
    concurrency: int | str
    chunk_tokens: int
    realised_reuse: float
    num_unique_items: int
    mean_prompt_tokens: float
    arms: dict[str, ArmFigures]

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "concurrency": self.concurrency,
            "chunk_tokens": self.chunk_tokens,
            "realised_reuse": self.realised_reuse,
            "unique_items": self.num_unique_items,
            "mean_prompt_tokens": self.mean_prompt_tokens,
            "arms": {name: arm.summary() for name, arm in self.arms.items()},
        }
