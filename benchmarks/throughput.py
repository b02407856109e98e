"""Throughput of Tessera against the model's own generate(), one request at a time in
one process, at several client concurrencies. Arms run interleaved (A B A B ...) in
groups, on the same seeded requests, and greedy tokens must agree."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from benchmarks.common import Progress, Prompt, Workload, markdown_table
from tessera.client import Client, Completion, Message
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc
from tests.reference import Reference


@dataclass
class ThroughputResult:
    concurrency: int
    num_requests: int
    reference_seconds: float
    tessera_seconds: float
    num_output_tokens: int
    encoder_passes_per_unique_image: float
    embedding_bytes_vs_minimum: float

    @property
    def ratio(self) -> float:
        return self.reference_seconds / self.tessera_seconds


def run_tessera(address: str, prompts: list[Prompt], max_tokens: int, concurrency: int):
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens)

    def one(prompt: Prompt) -> Completion:
        with Client(address) as client:
            return client.complete([Message(role, parts) for role, parts in prompt], sampling)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, prompts))
    return time.perf_counter() - started, results


def run_reference(reference: Reference, prompts: list[Prompt], max_tokens: int):
    started = time.perf_counter()
    outputs = [reference.generate(prompt, max_tokens).token_ids for prompt in prompts]
    return time.perf_counter() - started, outputs


def encoder_passes(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest()).num_items_computed


def measure(
    cluster, reference: Reference, workload: Workload, concurrency: int
) -> ThroughputResult:
    prompts = workload.prompts()
    progress = Progress(len(prompts), f"throughput x{concurrency}")
    passes_before = encoder_passes(cluster.address("encoder"))
    reference_seconds = tessera_seconds = 0.0
    results: list[Completion] = []
    group_size = max(concurrency, 4)
    for start in range(0, len(prompts), group_size):
        group = prompts[start : start + group_size]
        seconds, expected = run_reference(reference, group, workload.max_tokens)
        reference_seconds += seconds
        seconds, outputs = run_tessera(
            cluster.address("gateway"), group, workload.max_tokens, concurrency
        )
        tessera_seconds += seconds
        for offset, (mine, theirs) in enumerate(zip(outputs, expected, strict=True)):
            if mine.token_ids != theirs:
                raise SystemExit(
                    f"FAIL: request {start + offset} differs from generate():\n"
                    f"  tessera   {mine.token_ids}\n  generate  {theirs}"
                )
        results += outputs
        progress.advance(len(group))
    passes = encoder_passes(cluster.address("encoder")) - passes_before
    distinct = {
        p for prompt in prompts for _, parts in prompt for p in parts if isinstance(p, bytes)
    }
    minimum = (
        sum(
            r.prompt_token_ids[r.stats.decoder.num_cached_prompt_tokens :].count(
                reference.image_token_id
            )
            for r in results
        )
        * reference.hidden_size
        * 4
    )
    received = sum(r.stats.num_embedding_bytes for r in results)
    return ThroughputResult(
        concurrency=concurrency,
        num_requests=len(prompts),
        reference_seconds=reference_seconds,
        tessera_seconds=tessera_seconds,
        num_output_tokens=sum(len(r.token_ids) for r in results),
        encoder_passes_per_unique_image=passes / max(1, len(distinct)),
        embedding_bytes_vs_minimum=received / minimum if minimum else 1.0,
    )


def table(results: list[ThroughputResult]) -> str:
    return markdown_table(
        [
            "clients",
            "requests",
            "generate() req/s",
            "tessera req/s",
            "tessera tok/s",
            "ratio",
            "encoder passes / unique image",
            "embedding bytes / minimum",
        ],
        [
            [
                r.concurrency,
                r.num_requests,
                r.num_requests / r.reference_seconds,
                r.num_requests / r.tessera_seconds,
                r.num_output_tokens / r.tessera_seconds,
                r.ratio,
                r.encoder_passes_per_unique_image,
                r.embedding_bytes_vs_minimum,
            ]
            for r in results
        ],
    )
