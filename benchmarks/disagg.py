"""When disaggregation pays off: `tessera` (encoder service, rows fetched per chunk over
gRPC) beside `colocated` (the encoder in the decoder's process, `--colocated-encoder`, as
vLLM v1 runs by default), on two cells at the other ends of the media/text balance:

- vision-heavy: 4 images of 1024-1536 px per request, short text, half of the images
  seen before; the media tower and image decoding are a large share of the work;
- image-light: one small image and 400-800 words of text; the language model is.

With the encoder in its own process, its work overlaps the decoder's steps (on an
accelerator, another device; here, the other core) and its cache is shared by every
decoder; colocated, it runs between the decoder's steps on the decoder's thread and
pays no transfer.
"""

from __future__ import annotations

from benchmarks.common import markdown_table
from benchmarks.figures import CellResult, ratio
from benchmarks.services import ServiceArm, shared_host_threads
from benchmarks.suite import CellRunner
from benchmarks.workloads import Spec
from tessera.testbed.cluster import Cluster

CONCURRENCY = 4


def add_colocated_deployment(
    cluster: Cluster, name: str, model: str, decoder_flags: list[str]
) -> ServiceArm:
    """A gateway with no encoders in front of one `--colocated-encoder` decoder."""
    base = ["--model", model]
    decoder_flags = [*shared_host_threads("decoder", decoder_flags), *decoder_flags]
    decoder = cluster.start(
        f"{name}-decoder", "decoder", [*base, "--colocated-encoder", *decoder_flags]
    )
    gateway_flags = [*shared_host_threads("gateway", ()), "--decoders", decoder]
    cluster.start(f"{name}-gateway", "gateway", [*base, *gateway_flags])
    return ServiceArm(name, cluster, [], f"{name}-decoder", f"{name}-gateway")


def cells(num_requests: int) -> list[Spec]:
    return [
        Spec(
            "vision-heavy-c4",
            num_requests,
            4,
            0.5,
            text_words=(16, 48),
            output_tokens=(16, 16),
            image_side=(1024, 1536),
            seed=700,
        ),
        Spec(
            "image-light-c4",
            num_requests,
            1,
            0.5,
            text_words=(400, 800),
            output_tokens=(16, 32),
            image_side=(96, 160),
            seed=701,
        ),
    ]


def measure(
    runner: CellRunner, colocated: ServiceArm, tessera: ServiceArm, num_requests: int
) -> list[CellResult]:
    return [
        runner.closed_loop(spec.name, spec, [colocated, tessera], CONCURRENCY)
        for spec in cells(num_requests)
    ]


def table(results: list[CellResult], colocated: str, tessera: str) -> str:
    rows = []
    for cell in results:
        ours, theirs = cell.arms[tessera].summary(), cell.arms[colocated].summary()
        rows.append(
            [
                cell.name,
                theirs["requests_per_s"],
                ours["requests_per_s"],
                ratio(ours["requests_per_s"], theirs["requests_per_s"]),
                theirs["ttft_p50_ms"],
                ours["ttft_p50_ms"],
                theirs["ttft_p99_ms"],
                ours["ttft_p99_ms"],
                theirs["itl_p50_ms"],
                ours["itl_p50_ms"],
            ]
        )
    header = [
        "cell",
        f"{colocated} req/s",
        f"{tessera} req/s",
        f"{tessera} / {colocated} throughput",
        f"{colocated} TTFT p50 ms",
        f"{tessera} TTFT p50 ms",
        f"{colocated} TTFT p99 ms",
        f"{tessera} TTFT p99 ms",
        f"{colocated} ITL p50 ms",
        f"{tessera} ITL p50 ms",
    ]
    return markdown_table(header, rows)
