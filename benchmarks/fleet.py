"""Issue 4's benchmark: an encoder fleet (two replicas sharing a private Redis) against
Tessera with the embedding cache off, on requests drawn from a pool of images (80%
reuse) and on distinct images; plus encoder throughput with batching on and off."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from benchmarks.common import Progress, markdown_table
from benchmarks.figures import CellResult, median, percentile
from benchmarks.services import ServiceArm, encoder_stats
from benchmarks.suite import CellRunner
from benchmarks.workloads import Spec
from tessera.media import decode_image
from tessera.server import GRPC_OPTIONS
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

COUNTERS = (
    "num_items_requested",
    "num_items_computed",
    "num_memory_hits",
    "num_redis_hits",
    "num_joined_in_flight",
    "num_remote_waits",
    "num_slice_misses",
)


@dataclass
class FleetResult:
    workload: str
    cell: CellResult
    counters: dict[str, int] = field(default_factory=dict)  # fleet encoders, summed


def start_processes(
    cluster: Cluster, model: str, redis_url: str, pool_size: int, no_cache: ServiceArm
) -> ServiceArm:
    """Two encoders sharing Redis behind their own gateway, using the no-cache arm's
    decoder (prefix caching off there, so TTFT shows the embedding cache alone); plus two
    standalone encoders, batching on and off."""
    # L1 holds a quarter of the pool (512 KiB per bench image), so L2 gets traffic.
    l1 = str(max(1, pool_size // 4) * (512 << 10) + (64 << 10))
    base = ["--model", model]
    batch = ["--max-batch-items", "16", "--max-batch-wait-ms", "5"]
    flags = [*base, "--redis-url", redis_url, "--cache-bytes", l1, *batch]
    encoders = [cluster.start(f"fleet-encoder{i}", "encoder", flags) for i in range(2)]
    decoder = cluster.address(no_cache.decoder)
    cluster.start(
        "fleet-gateway",
        "gateway",
        [*base, "--encoders", ",".join(encoders), "--decoders", decoder],
    )
    cluster.start("batch-on", "encoder", [*base, *batch])
    cluster.start("batch-off", "encoder", [*base, "--max-batch-items", "1"])
    return ServiceArm(
        "fleet", cluster, ["fleet-encoder0", "fleet-encoder1"], no_cache.decoder, "fleet-gateway"
    )


def run_workloads(
    runner: CellRunner,
    fleet: ServiceArm,
    no_cache: ServiceArm,
    num_requests: int,
    pool_size: int,
    verify_every: int,
) -> list[FleetResult]:
    results = []
    specs = [
        ("pool", Spec("fleet pool", num_requests, 1, 1 - pool_size / num_requests, seed=4001)),
        ("distinct", Spec("fleet distinct", num_requests, 1, 0.0, seed=4002)),
    ]
    for workload, base in specs:
        spec = Spec(
            base.name,
            base.num_requests,
            1,
            base.reuse,
            text_words=(8, 24),
            output_tokens=(4, 4),
            chunk_tokens=256,
            seed=base.seed,
        )
        addresses = [fleet.cluster.address(e) for e in fleet.encoders]
        before = [encoder_stats(a) for a in addresses]
        cell = runner.closed_loop(
            f"fleet {workload}", spec, [fleet, no_cache], 4, group_size=8, verify_every=verify_every
        )
        after = [encoder_stats(a) for a in addresses]
        counters = {
            name: sum(
                getattr(a, name) - getattr(b, name) for a, b in zip(after, before, strict=True)
            )
            for name in COUNTERS
        }
        results.append(FleetResult(workload, cell, counters))
    return results


def fleet_table(results: list[FleetResult], fleet: str, no_cache: str) -> str:
    rows = []
    for result in results:
        c, cell = result.counters, result.cell
        requested = max(1, c["num_items_requested"])
        on, off = cell.arms[fleet], cell.arms[no_cache]
        rows.append(
            [
                result.workload,
                cell.arms[fleet].num_requests,
                cell.num_unique_items,
                f"{cell.realised_reuse:.0%}",
                c["num_items_computed"] / max(1, cell.num_unique_items),
                c["num_memory_hits"] / requested,
                c["num_redis_hits"] / requested,
                c["num_joined_in_flight"],
                c["num_remote_waits"],
                median(on.ttft_s) * 1000,
                percentile(on.ttft_s, 99) * 1000,
                median(off.ttft_s) * 1000,
                percentile(off.ttft_s, 99) * 1000,
                off.passes_per_unique_item,
            ]
        )
    return markdown_table(
        [
            "images",
            "requests",
            "unique",
            "reuse",
            "fleet passes / unique item",
            "L1 hits / item requested",
            "L2 hits / item requested",
            "joined in flight",
            "remote waits",
            "TTFT p50 ms cache on",
            "TTFT p99 ms cache on",
            "TTFT p50 ms cache off",
            "TTFT p99 ms cache off",
            "passes / unique item cache off",
        ],
        rows,
    )


# -- encoder throughput with batching on and off -------------------------------------------


@dataclass
class BatchingResult:
    items_per_s: dict[str, float]
    mean_batch_size: dict[str, float]


def _encode_all(address: str, items: list[common_pb2.MediaItem], concurrency: int) -> float:
    with grpc.insecure_channel(address, options=GRPC_OPTIONS) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(
                pool.map(
                    lambda item: stub.Encode(encoder_pb2.EncodeRequest(items=[item]), timeout=120),
                    items,
                )
            )
        return time.perf_counter() - started


def batching(
    encoders: dict[str, str], fingerprint: str, num_items: int, concurrency: int = 16
) -> BatchingResult:
    """Distinct images, one per Encode call, `concurrency` calls at a time; arms take
    turns in groups of `concurrency` items."""

    def item(seed: int) -> common_pb2.MediaItem:
        data = noise_image(seed, 224, 224)
        return common_pb2.MediaItem(
            modality=common_pb2.MODALITY_IMAGE,
            data=data,
            content_hash=decode_image(data).content_hash(fingerprint),
        )

    seconds = {name: 0.0 for name in encoders}
    for name, address in encoders.items():  # warm-up
        _encode_all(address, [item(7_000_000 + len(name) + i) for i in range(4)], 4)
    before = {name: encoder_stats(address) for name, address in encoders.items()}
    groups = max(1, num_items // concurrency)
    progress = Progress(groups * len(encoders), "encoder batching")
    seed = 8_000_000
    for turn in range(groups):
        names = list(encoders)
        names = names[turn % len(names) :] + names[: turn % len(names)]
        for name in names:
            items = [item(seed + i) for i in range(concurrency)]
            seed += concurrency
            seconds[name] += _encode_all(encoders[name], items, concurrency)
            progress.advance()
    mean_batch = {}
    for name, address in encoders.items():
        after = encoder_stats(address)
        batches = after.num_batches - before[name].num_batches
        items = after.num_batched_items - before[name].num_batched_items
        mean_batch[name] = items / batches if batches else float("nan")
    total = groups * concurrency
    return BatchingResult({n: total / s for n, s in seconds.items()}, mean_batch)


def batching_table(result: BatchingResult) -> str:
    names = list(result.items_per_s)
    base = result.items_per_s[names[-1]]
    return markdown_table(
        ["encoder", "items/s", "mean batch size", "vs batching off"],
        [
            [n, result.items_per_s[n], result.mean_batch_size[n], result.items_per_s[n] / base]
            for n in names
        ],
    )


def summary(results: list[FleetResult], batching_result: BatchingResult | None) -> dict:
    return {
        "workloads": [
            {"workload": r.workload, "counters": r.counters, **r.cell.summary()} for r in results
        ],
        "batching": None
        if batching_result is None
        else {
            "items_per_s": batching_result.items_per_s,
            "mean_batch_size": batching_result.mean_batch_size,
        },
    }
