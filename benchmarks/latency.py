"""Inter-token latency of running requests while long multimodal prompts arrive, with
chunked prefill on and off. With it off, a long prompt's whole prefill shares one step
with the decodes of everybody else, and their next token waits for it."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from benchmarks.common import Progress, Workload, markdown_table, median, percentile
from tessera.client import Client, Message
from tessera.v1 import common_pb2


@dataclass
class LatencyResult:
    label: str
    chunk_tokens: int
    num_gaps: int
    p50_ms: float
    p99_ms: float

    @property
    def p99_over_p50(self) -> float:
        return self.p99_ms / self.p50_ms


def measure(
    address: str,
    label: str,
    chunk_tokens: int,
    num_background: int = 4,
    background_tokens: int = 80,
    long_prompts: Workload | None = None,
) -> LatencyResult:
    long_prompts = long_prompts or Workload(3, 12, 4, 200, 4, seed=77)
    gaps: list[float] = []
    lock = threading.Lock()
    started = threading.Barrier(num_background + 1)
    progress = Progress(num_background + long_prompts.num_requests, label)

    def background(index: int) -> None:
        sampling = common_pb2.SamplingParams(max_tokens=background_tokens, ignore_eos=True)
        times: list[float] = []
        with Client(address) as client:
            prompt = [Message("user", [f"Tell a story about the {index} birds."])]
            for response in client.stream(prompt, sampling, cache_salt=f"bg-{label}-{index}"):
                if response.HasField("delta") and response.delta.token_ids:
                    times.append(time.perf_counter())
                    if len(times) == 4:
                        started.wait()
        with lock:
            # Gaps between tokens once every stream runs (the first few include admission).
            gaps.extend(b - a for a, b in itertools.pairwise(times[4:]))
        progress.advance()

    threads = [threading.Thread(target=background, args=(i,)) for i in range(num_background)]
    for thread in threads:
        thread.start()
    started.wait()
    sampling = common_pb2.SamplingParams(max_tokens=long_prompts.max_tokens)
    with Client(address) as client:
        for prompt in long_prompts.prompts():
            client.complete(
                [Message(role, parts) for role, parts in prompt],
                sampling,
                max_chunk_tokens=chunk_tokens,
                cache_salt=f"long-{label}",
            )
            progress.advance()
    for thread in threads:
        thread.join()
    return LatencyResult(
        label, chunk_tokens, len(gaps), median(gaps) * 1000, percentile(gaps, 99) * 1000
    )


def table(results: list[LatencyResult]) -> str:
    return markdown_table(
        ["prefill", "chunk tokens", "gaps", "ITL p50 ms", "ITL p99 ms", "p99 / p50"],
        [
            [
                r.label,
                r.chunk_tokens or "whole prompt",
                r.num_gaps,
                r.p50_ms,
                r.p99_ms,
                r.p99_over_p50,
            ]
            for r in results
        ],
    )
