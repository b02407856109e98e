"""`make bench`: Tessera over gRPC against the model's own generate(), side by side.

Both arms answer the same seeded requests on the same checkpoint (the `bench` demo model
unless --model is given); greedy tokens must agree or the run fails. Printed: requests/s
and output tokens/s per arm and their ratio, encoder passes per unique image, and
embedding bytes the decoder received against the minimum (overlap rows x hidden x dtype).

This is the first benchmark; the full matrix of arms and workloads is issue 6.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from tessera.client import Client, Message
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc
from tests.cluster import Cluster
from tests.reference import Reference, noise_image

WORDS = [
    "a",
    "red",
    "cat",
    "sits",
    "on",
    "the",
    "old",
    "blue",
    "chair",
    "near",
    "one",
    "small",
    "window",
    "while",
    "two",
    "birds",
    "fly",
]


@dataclass(frozen=True)
class Workload:
    num_requests: int
    num_distinct_images: int
    num_text_words: int
    max_tokens: int
    concurrency: int
    seed: int

    def requests(self) -> list[list[tuple[str, list[str | bytes]]]]:
        rng = random.Random(self.seed)
        pool = [
            noise_image(self.seed * 1000 + i, 64 + i, 48 + i)
            for i in range(self.num_distinct_images)
        ]
        requests = []
        for _ in range(self.num_requests):
            text = " ".join(rng.choice(WORDS) for _ in range(self.num_text_words))
            requests.append([("user", [rng.choice(pool), text])])
        return requests


class Progress:
    def __init__(self, total: int):
        self.total = total
        self.done = 0

    def advance(self) -> None:
        self.done += 1
        filled = 30 * self.done // self.total
        bar = "#" * filled + "." * (30 - filled)
        print(f"\r  [{bar}] {self.done}/{self.total} requests", end="", flush=True)
        if self.done == self.total:
            print()


def run_reference(reference: Reference, requests, max_tokens: int) -> tuple[float, list[list[int]]]:
    outputs = []
    started = time.perf_counter()
    for request in requests:
        outputs.append(reference.generate(request, max_tokens).token_ids)
    return time.perf_counter() - started, outputs


def run_tessera(address: str, requests, workload: Workload):
    sampling = common_pb2.SamplingParams(max_tokens=workload.max_tokens)

    def one(request):
        with Client(address) as client:
            return client.complete([Message(role, parts) for role, parts in request], sampling)

    started = time.perf_counter()
    with ThreadPoolExecutor(workload.concurrency) as pool:
        results = list(pool.map(one, requests))
    return time.perf_counter() - started, results


def encoder_passes(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stats = encoder_pb2_grpc.EncoderServiceStub(channel).GetStats(
            encoder_pb2.GetEncoderStatsRequest()
        )
    return stats.num_items_computed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint (default: a fresh bench demo model)")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument(
        "--distinct-images", type=int, default=5, help="pool size (reuse = 1 - pool/requests)"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-chunk-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    if args.model:
        model = args.model
    else:
        from tessera.demo_model import make_demo_model

        print("making the bench demo model")
        model = str(make_demo_model(workdir / "bench", seed=0, size="bench"))
    workload = Workload(
        args.requests, args.distinct_images, 40, args.max_tokens, args.concurrency, seed=1
    )
    requests = workload.requests()
    print(f"workload: {workload}")

    cluster = Cluster()
    try:
        encoder = cluster.start("encoder", "encoder", ["--model", model])
        decoder = cluster.start(
            "decoder",
            "decoder",
            ["--model", model, "--max-chunk-tokens", str(args.max_chunk_tokens)],
        )
        cluster.start(
            "gateway", "gateway", ["--model", model, "--encoders", encoder, "--decoders", decoder]
        )
        print("starting services and loading the reference model")
        cluster.wait_ready()
        reference = Reference(Path(model))
        # Warm-up on a request outside the measured set.
        warm = Workload(1, 1, 8, 2, 1, seed=99).requests()
        reference.generate(warm[0], 2)
        run_tessera(cluster.address("gateway"), warm, Workload(1, 1, 8, 2, 1, 99))
        passes_before = encoder_passes(encoder)
        # Interleaved (A B A B ...) in groups of `concurrency` requests, so load from
        # anything else on the machine falls on both arms alike.
        reference_seconds = tessera_seconds = 0.0
        bar = Progress(len(requests))
        expected, results = [], []
        for start in range(0, len(requests), args.concurrency):
            group = requests[start : start + args.concurrency]
            seconds, outputs = run_reference(reference, group, args.max_tokens)
            reference_seconds += seconds
            expected += outputs
            seconds, outputs = run_tessera(cluster.address("gateway"), group, workload)
            tessera_seconds += seconds
            results += outputs
            for _ in group:
                bar.advance()
        passes = encoder_passes(encoder) - passes_before
    finally:
        cluster.stop()

    mismatches = [
        i for i, (r, e) in enumerate(zip(results, expected, strict=True)) if r.token_ids != e
    ]
    if mismatches:
        print(f"FAIL: greedy tokens differ from generate() for requests {mismatches}")
        return 1
    hidden, itemsize = reference.hidden_size, 4
    minimum = sum(
        r.prompt_token_ids.count(reference.image_token_id) * hidden * itemsize for r in results
    )
    received = sum(r.stats.num_embedding_bytes for r in results)
    output_tokens = sum(len(r.token_ids) for r in results)
    distinct = len(
        {id(p) for req in requests for _, parts in req for p in parts if isinstance(p, bytes)}
    )
    figures = {
        "hf_generate_requests_per_s": len(requests) / reference_seconds,
        "tessera_requests_per_s": len(requests) / tessera_seconds,
        "throughput_ratio": reference_seconds / tessera_seconds,
        "tessera_output_tokens_per_s": output_tokens / tessera_seconds,
        "encoder_passes_per_unique_image": passes / distinct,
        "embedding_bytes_vs_minimum": received / minimum if minimum else 1.0,
    }
    print("\n| figure | value |\n|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"workload": workload.__dict__, **figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
