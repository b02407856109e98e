"""Video: rows fetched per chunk (tessera) against the whole video per chunk (whole-fetch),
beside `generate()` (issue 17).

One minute of video is thousands of embedding rows, far more than a prefill chunk, so
this is where fetching only the rows of a chunk's positions matters most. The cell: a
Qwen2.5-VL checkpoint (default: the bench demo model), clips of 10-60 s (4 fps at
160 x 120 px, which the family samples at 2 fps: 10-60 temporal steps of 24 rows), one
clip and a short question per request, half of the clips seen before, 4 clients, chunks
of 256 tokens. Arms, interleaved group by group: generate() (the oracle), whole-fetch
(`--fetch-mode whole`: every chunk fetches each video it touches whole, as an encoder
that hands its whole output over does) and tessera. Each service arm has its own
encoder, so neither warms the other's cache. Every output is checked against generate().

Usage: python -m benchmarks.video [--model DIR] [--requests N] [--seconds MIN MAX]
                                  [--chunk-tokens N] [--json OUT]
`make bench` runs it in a process of its own (suite `video`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import bench_model, markdown_table
from benchmarks.figures import CellResult
from benchmarks.inprocess import HfGenerate
from benchmarks.report import cell_section
from benchmarks.services import add_deployment
from benchmarks.suite import CellRunner, ModelShape, References
from benchmarks.workloads import Spec
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import Reference

CONCURRENCY = 4
DECODER_FLAGS = ["--max-chunk-tokens", "2048", "--max-num-batched-tokens", "2064"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a Qwen-VL checkpoint (default: the bench demo model)")
    parser.add_argument("--family", default="qwen2.5-vl", help="demo model made without --model")
    parser.add_argument("--requests", type=int, default=16, help="requests per arm")
    parser.add_argument("--seconds", type=int, nargs=2, default=(10, 60), metavar=("MIN", "MAX"))
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--json", type=Path, help="write the cell's summary and table here")
    return parser.parse_args(argv)


def spec(args: argparse.Namespace) -> Spec:
    return Spec(
        f"video-{args.seconds[0]}-{args.seconds[1]}s-c{CONCURRENCY}",
        args.requests,
        1,
        0.5,
        text_words=(8, 24),
        output_tokens=(16, 16),
        chunk_tokens=args.chunk_tokens,
        image_side=(0, 0),  # no images: every item is a video
        video_seconds=tuple(args.seconds),
        seed=900,
    )


def table(cell: CellResult, tessera: str, whole: str, hf: str) -> str:
    rows = []
    for name in (hf, whole, tessera):
        arm = cell.arms[name].summary()
        over = arm["embedding_bytes_over_minimum"]
        rows.append(
            [
                name,
                arm["requests_per_s"],
                arm["ttft_p50_ms"],
                arm["ttft_p99_ms"],
                arm["embedding_bytes"] / 2**20 if name != hf else "-",
                over if name != hf else "-",
                arm["fetch_wait_fraction"] if name != hf else "-",
            ]
        )
    headers = [
        "arm",
        "req/s",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "rows received MiB",
        "bytes / minimum",
        "forward's wait on rows",
    ]
    return markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = bench_model(args.model, args.family)
    cluster = Cluster()
    try:
        tessera = add_deployment(cluster, "tessera", model, 1, (), DECODER_FLAGS)
        whole_flags = [*DECODER_FLAGS, "--fetch-mode", "whole"]
        whole = add_deployment(cluster, "whole-fetch", model, 1, (), whole_flags)
        cluster.wait_ready()
        reference = Reference(Path(model))
        hf = HfGenerate(reference)
        video_token = reference.model.config.video_token_id
        runner = CellRunner(References(hf), ModelShape(video_token, reference.row_bytes, (0, 0)))
        cell = runner.closed_loop("video", spec(args), [hf, whole, tessera], CONCURRENCY)
        text = table(cell, tessera.name, whole.name, hf.name)
        print(f"\n{text}\n\n{cell_section(cell)}")
        if args.json:
            summary = {"cell": cell.summary(), "table": text, "section": cell_section(cell)}
            args.json.write_text(json.dumps(summary, indent=2))
        tessera.close()
        whole.close()
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
