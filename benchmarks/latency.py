"""Inter-token latency of running requests while long multimodal prompts prefill, for
several prefill chunk sizes. Without chunking a long prompt's whole prefill shares one
engine step with everybody else's decode, and their next token waits for all of it."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from benchmarks.common import Progress, markdown_table
from benchmarks.figures import median, percentile
from benchmarks.services import ServiceArm, timed_request
from benchmarks.workloads import Spec, requests_for
from tessera.client import Client, Message
from tessera.v1 import common_pb2


@dataclass
class LatencyResult:
    chunk_tokens: int  # 0: the whole prompt in one step
    num_gaps: int
    p50_ms: float
    p99_ms: float
    long_prompt_tokens: int
    long_ttft_ms: float

    @property
    def p99_over_p50(self) -> float:
        return self.p99_ms / self.p50_ms


def measure(
    arm: ServiceArm,
    chunk_tokens: int,
    long_prompts: Spec,
    num_background: int = 3,
    background_tokens: int = 2000,
) -> LatencyResult:
    """`num_background` streams decode while the long prompts arrive one after another;
    the gaps between their tokens while the long prompts run are the inter-token
    latencies (the streams stop once the long prompts are done)."""
    address = arm.cluster.address(arm.gateway)
    streams: list[list[float]] = []
    lock = threading.Lock()
    started = threading.Barrier(num_background + 1)
    label = f"ITL chunk {chunk_tokens or 'whole'}"
    prompts = [
        r.with_chunk(chunk_tokens, f"long-{chunk_tokens}") for r in requests_for(long_prompts)
    ]
    progress = Progress(num_background + len(prompts), label)
    stop_after = threading.Event()

    def background(index: int) -> None:
        sampling = common_pb2.SamplingParams(max_tokens=background_tokens, ignore_eos=True)
        times: list[float] = []
        with Client(address) as client:
            prompt = [
                Message("user", [f"Tell a story about {index} birds and chunk {chunk_tokens}."])
            ]
            stream = client.stream(prompt, sampling, cache_salt=f"bg-{chunk_tokens}-{index}")
            for response in stream:
                if response.HasField("delta") and response.delta.token_ids:
                    times.append(time.perf_counter())
                    if len(times) == 4:
                        started.wait()
                if stop_after.is_set():
                    break
        with lock:
            streams.append(times)
        progress.advance()

    threads = [threading.Thread(target=background, args=(i,)) for i in range(num_background)]
    for thread in threads:
        thread.start()
    started.wait()  # every stream is past admission
    window_start = time.perf_counter()
    outcomes = []
    with Client(address) as client:
        for prompt in prompts:
            outcomes.append(timed_request(client, prompt))
            progress.advance()
    window_end = time.perf_counter()
    stop_after.set()
    for thread in threads:
        thread.join()
    gaps = [
        b - a
        for times in streams
        for a, b in itertools.pairwise(times)
        if window_start <= b <= window_end
    ]
    return LatencyResult(
        chunk_tokens=chunk_tokens,
        num_gaps=len(gaps),
        p50_ms=median(gaps) * 1000,
        p99_ms=percentile(gaps, 99) * 1000,
        long_prompt_tokens=max(len(o.prompt_token_ids) for o in outcomes),
        long_ttft_ms=median([o.ttft_s for o in outcomes]) * 1000,
    )


def table(results: list[LatencyResult]) -> str:
    return markdown_table(
        [
            "prefill chunk",
            "long prompt tokens",
            "gaps",
            "ITL p50 ms",
            "ITL p99 ms",
            "p99 / p50",
            "long prompt TTFT p50 ms",
        ],
        [
            [
                r.chunk_tokens or "whole prompt",
                r.long_prompt_tokens,
                r.num_gaps,
                r.p50_ms,
                r.p99_ms,
                r.p99_over_p50,
                r.long_ttft_ms,
            ]
            for r in results
        ],
    )
