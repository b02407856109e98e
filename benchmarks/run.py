"""`make bench`: Tessera against the model's own generate(), side by side.

    python -m benchmarks.run [--quick] [--model M] [--json FILE]

Suites: throughput at 1, 4 and 16 concurrent clients (80% image reuse) and inter-token
latency of running requests while long multimodal prompts arrive, chunked prefill on and
off. Every Tessera output is checked against generate(); a difference fails the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path

import torch

from benchmarks import latency, throughput
from benchmarks.common import Workload, bench_model, start_services
from tests.reference import Reference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint (default: a fresh bench demo model)")
    parser.add_argument("--quick", action="store_true", help="fewer requests (a few minutes)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()

    model = bench_model(args.model)
    num_requests = 16 if args.quick else 48
    environment = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "model": model,
    }
    print(f"environment: {environment}")

    print("\n## Throughput (80% image reuse, 1 image, ~40 words, 16 output tokens)")
    cluster = start_services(model)
    try:
        reference = Reference(Path(model))
        warm = Workload(2, 2, 1, 8, 2, seed=99)
        throughput.measure(cluster, reference, warm, 1)
        results = []
        for concurrency in args.concurrency:
            workload = Workload(
                num_requests, max(1, num_requests // 5), 1, 40, 16, seed=concurrency
            )
            results.append(throughput.measure(cluster, reference, workload, concurrency))
    finally:
        cluster.stop()
    print(throughput.table(results))

    print("\n## Inter-token latency while long multimodal prompts arrive")
    cluster = start_services(
        model, decoder_flags=["--max-chunk-tokens", "4096", "--max-num-batched-tokens", "4096"]
    )
    try:
        long_prompts = Workload(2 if args.quick else 4, 16, 4, 200, 4, seed=77)
        latencies = [
            latency.measure(cluster.address("gateway"), "chunked", 128, long_prompts=long_prompts),
            latency.measure(cluster.address("gateway"), "unchunked", 0, long_prompts=long_prompts),
        ]
    finally:
        cluster.stop()
    print(latency.table(latencies))

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "environment": environment,
                    "throughput": [dataclasses.asdict(r) | {"ratio": r.ratio} for r in results],
                    "latency": [dataclasses.asdict(r) for r in latencies],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
