"""`make bench`: Tessera and every baseline side by side, on the same seeded requests.

    python -m benchmarks.run [--quick] [--family NAME | --model M] [--image-sides MIN MAX]
                             [--out DIR] [--redis-url URL] [--tls] [--encoder-flags FLAGS]
                             [--growth-repeats N] [--device D] [--dtype T]
                             [--suites arms chunks poisson latency wire step growth fleet
                                       disagg video]

Arms: hf-generate (generate() in this process), reencode-per-chunk (chunked prefill that
re-runs the vision tower for every chunk touching an image), whole-fetch (the decoder
fetches whole items for every chunk), no-cache (embedding cache and prefix cache off),
tessera. Every arm's greedy tokens are checked against generate(); a real difference
fails the run. Writes results.json, results.md and PNG plots to --out; a suite that fails
(a difference, a refused request) is listed there and fails the run, after the other
suites have run and their tables are written.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import disagg, fleet, growth, latency, plots, report, wire
from benchmarks.common import bench_model, environment
from benchmarks.inprocess import HfGenerate, ReencodePerChunk
from benchmarks.options import BASELINE_SUITES, parse_args, run_bench, scale_of
from benchmarks.scale import Scale
from benchmarks.services import add_deployment
from benchmarks.suite import CellRunner, ModelShape, References
from benchmarks.workloads import Spec
from tessera.testbed.cluster import Cluster
from tessera.testbed.devices import RunOn
from tessera.testbed.redis_server import PrivateRedis
from tessera.testbed.reference import Reference
from tessera.tls import TlsFiles

# Image sides (min, max) in px drawn by the workloads, by family: dynamic-resolution
# families get images from 200 px to 1500 px (Qwen2.5-VL bench: ~50 to ~2500 rows).
IMAGE_SIDES = {name: (200, 1500) for name in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe")}
DEFAULT_IMAGE_SIDES = (96, 320)
# Audio families draw clips of 2-30 s instead of images (a Qwen2-Audio window is 30 s).
CLIP_SECONDS = (2.0, 30.0)
# Families that take video: the video suite runs on the run's model when it is one.
VIDEO_FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe")
# Room for a whole prompt in one chunk (the latency suite's unchunked case); every other
# request names its chunk size. A step prefills 512 prompt tokens, as a decoder with the
# default --max-chunk-tokens does (one chunk larger than that still runs, alone).
DECODER_FLAGS = ["--max-chunk-tokens", "2048", "--max-num-batched-tokens", "2064"]
DECODER_FLAGS += ["--max-num-seqs", "16", "--max-prefill-tokens-per-step", "512"]
# No embedding cache: nothing is kept unpinned, but a request's pins keep its items until
# its prefill has them (without a pin budget an item finished before the decoder asked
# for it was gone, and the arm worked only while fetches won that race).
NO_CACHE_ENCODER_FLAGS = ["--cache-bytes", "0", "--max-pinned-bytes", str(64 << 20)]
NO_CACHE_ENCODER_FLAGS += ["--max-pinned-bytes-per-owner", str(64 << 20)]


class Bench:
    def __init__(self, args: argparse.Namespace, scale: Scale):
        self.args, self.scale = args, scale
        self.model = bench_model(args.model, args.family)
        self.env = environment(self.model, sys.argv[1:])
        print(f"environment: {json.dumps(self.env)}", flush=True)
        self.tls = role_certificates() if args.tls else None
        self.cluster = Cluster(client_tls=self.tls["client"] if self.tls else None)
        self.redis = None
        # Set by start(); None until then, so that stop() after a failed start stops
        # what did start and the start's error is what the run reports.
        self.tessera = self.tessera_b = self.tessera_mtls = self.mtls_cluster = None
        self.whole = self.no_cache = self.colocated = None
        self.fingerprint = uuid.uuid4().hex if args.redis_url else None
        self.results: dict[str, object] = {"environment": self.env}
        self.md: list[str] = []

    def start(self) -> None:
        model, suites = self.model, self.args.suites
        unique = ["--model-fingerprint", self.fingerprint] if self.fingerprint else []
        unique += RunOn(self.args.device, self.args.dtype).service_args()
        redis = ["--redis-url", self.args.redis_url] if self.args.redis_url else []
        self.tessera = add_deployment(
            self.cluster,
            "tessera",
            model,
            1,
            [*redis, *shlex.split(self.args.encoder_flags)],
            DECODER_FLAGS,
            unique,
            self.tls,
        )
        compare = self.args.growth_compare_encoder_flags
        if compare is not None:
            b_flags = [*redis, *shlex.split(compare)]
            self.tessera_b = add_deployment(
                self.cluster, "tessera-b", model, 1, b_flags, DECODER_FLAGS, unique, self.tls
            )
        if "growth" in suites and not self.args.tls:
            # The growth table also shows the front door of a gateway the encoder
            # authenticates: hashes taken as given, large images sent processed.
            certs = role_certificates()
            self.mtls_cluster = Cluster(client_tls=certs["client"])
            encoder_flags = shlex.split(self.args.encoder_flags)
            self.tessera_mtls = add_deployment(
                self.mtls_cluster,
                "tessera-mtls",
                model,
                1,
                encoder_flags,
                DECODER_FLAGS,
                unique,
                certs,
            )
        # The baselines run only in the suites that compare them: three service
        # processes each, on a machine that may be short of memory.
        if self.baselines:
            whole_flags = [*DECODER_FLAGS, "--fetch-mode", "whole"]
            on = RunOn(self.args.device, self.args.dtype).service_args()
            self.whole = add_deployment(
                self.cluster, "whole-fetch", model, 1, (), whole_flags, on, self.tls
            )
            self.no_cache = add_deployment(
                self.cluster,
                "no-cache",
                model,
                1,
                NO_CACHE_ENCODER_FLAGS,
                [*DECODER_FLAGS, "--no-enable-prefix-caching"],
                on,
                self.tls,
            )
        if "disagg" in suites:
            self.colocated = disagg.add_colocated_deployment(
                self.cluster, "colocated", model, DECODER_FLAGS
            )
        if "fleet" in suites:
            self._start_fleet()
        started = time.perf_counter()
        print(f"starting {len(self.cluster.children)} service processes", flush=True)
        self.cluster.wait_ready()
        if self.mtls_cluster is not None:
            self.mtls_cluster.wait_ready()
        print(f"  ready in {time.perf_counter() - started:.0f}s", flush=True)
        # What --linear-kernel auto chose on this host: figures depend on it.
        self.env["decoder_linear_kernel"] = self.cluster.ready_field(self.tessera.decoder, "linear")
        reference = Reference(Path(model), RunOn(self.args.device, self.args.dtype))
        self.hf = HfGenerate(reference)
        # Its own chunked loop builds positions and masks on the CPU.
        on_cpu = self.args.device == "cpu"
        self.reencode = (
            ReencodePerChunk(reference)
            if self.baselines and on_cpu and ReencodePerChunk.supports(reference)
            else None
        )
        sides = self.args.image_sides or IMAGE_SIDES.get(self.args.family, DEFAULT_IMAGE_SIDES)
        self.env["image_sides"] = list(sides)
        clips = CLIP_SECONDS if takes_audio(reference) else None
        self.env["clip_seconds"] = list(clips) if clips else None
        self.runner = CellRunner(
            References(self.hf),
            ModelShape(reference.placeholder_token_id, reference.row_bytes, tuple(sides), clips),
        )
        self.arms = [self.hf, self.reencode, self.whole, self.no_cache, self.tessera]
        self.arms = [arm for arm in self.arms if arm is not None]
        warm = self.runner.with_default_side(
            Spec("warm-up", 2, 1, 0.0, output_tokens=(4, 4), seed=1)
        )
        self.runner.closed_loop("warm-up", warm, [*self.arms, *self.extra_arms], 2)

    def _start_fleet(self) -> None:
        self.redis = PrivateRedis(Path(tempfile.mkdtemp(prefix="tessera-bench-redis-")))
        self.redis.start()
        self.fleet = fleet.start_processes(
            self.cluster, self.model, self.redis.url, self.scale.fleet_pool, self.no_cache
        )

    @property
    def baselines(self) -> bool:
        """Whether a chosen suite compares the baseline arms (whole-fetch, no-cache,
        reencode-per-chunk), not only generate() and tessera."""
        return bool(set(self.args.suites) & set(BASELINE_SUITES))

    @property
    def extra_arms(self) -> list:
        """Arms only the growth table runs (--growth-compare-encoder-flags, and the
        mutual-TLS deployment unless every arm has mutual TLS)."""
        return [arm for arm in (self.tessera_b, self.tessera_mtls) if arm is not None]

    def stop(self) -> None:
        for arm in (self.tessera, self.whole, self.no_cache, self.colocated, *self.extra_arms):
            if arm is not None:
                arm.close()
        self.cluster.stop()
        if self.mtls_cluster is not None:
            self.mtls_cluster.stop()
        if self.redis is not None:
            self.redis.kill()

    # -- suites ------------------------------------------------------------------------

    def arms_suite(self) -> None:
        cells = [
            self.runner.closed_loop(
                spec.name,
                spec,
                self.arms,
                concurrency,
                spec.num_requests // spec.turns if spec.turns > 1 else None,
            )
            for spec, concurrency in self.scale.cells
        ]
        self.cells = cells
        self.results["cells"] = [c.summary() for c in cells]
        self.md += [
            "## Arms side by side\n",
            "### Headline: tessera against each arm\n",
            report.headline_table(cells),
            "",
        ]
        self.md += ["### Every arm, workload by workload\n", *map(report.cell_section, cells)]
        by_name = {c.name: c for c in cells}
        sweep = [by_name[n] for n in ("reuse80-c1", "reuse80-c4", "reuse80-c16") if n in by_name]
        out = self.args.out
        plots.throughput_vs_concurrency(sweep, out / "throughput_vs_concurrency.png")
        plots.latency_cdfs(by_name["reuse80-c4"], out / "latency_cdfs.png")
        self.md += [
            "![throughput](throughput_vs_concurrency.png)",
            "![latency CDFs](latency_cdfs.png)",
            "",
        ]

    def chunks_suite(self) -> None:
        cells = []
        for index, chunk in enumerate(self.scale.chunk_sizes):
            spec = Spec(
                f"chunk-{chunk}",
                self.scale.chunk_requests,
                self.scale.chunk_images,
                0.0,
                output_tokens=(16, 16),
                chunk_tokens=chunk,
                seed=200 + index,
            )
            cells.append(self.runner.closed_loop(spec.name, spec, self.arms, 2))
        self.chunk_cells = cells
        self.results["chunks"] = [c.summary() for c in cells]
        plots.bytes_vs_chunk(cells, self.args.out / "bytes_vs_chunk.png")
        self.md += [
            "## Chunk size: bytes received and encoder passes\n",
            f"{cells[0].description.split(', chunk')[0]}, fresh images per chunk size, "
            "2 clients.\n",
            report.chunk_table(cells),
            "",
            "![bytes vs chunk](bytes_vs_chunk.png)",
            "",
        ]

    def poisson_suite(self) -> None:
        spec = Spec(
            "poisson", self.scale.poisson_requests, 1, 0.8, output_tokens=(16, 64), seed=300
        )
        cell = self.runner.open_loop(
            "open-loop Poisson",
            spec,
            [self.whole, self.no_cache, self.tessera],
            self.scale.poisson_rate,
            segment=8,
        )
        self.results["poisson"] = cell.summary()
        self.md += ["## Open loop (Poisson arrivals)\n", report.cell_section(cell)]

    def latency_suite(self) -> None:
        long_prompts = Spec(
            "long",
            self.scale.latency_long_prompts,
            4,
            0.0,
            text_words=(200, 200),
            output_tokens=(4, 4),
            seed=400,
        )
        long_prompts = self.runner.with_default_side(long_prompts)
        self.latency = [
            latency.measure(self.tessera, chunk, long_prompts)
            for chunk in self.scale.latency_chunks
        ]
        self.results["latency"] = [vars(r) | {"p99_over_p50": r.p99_over_p50} for r in self.latency]
        self.md += [
            "## Inter-token latency while a long multimodal prompt prefills (tessera)\n",
            "3 streams decode while prompts of 4 images + 200 words arrive.\n",
            latency.table(self.latency),
            "",
        ]

    def wire_suite(self) -> None:
        address = self.cluster.address(self.tessera.encoders[0])
        self.wire = wire.measure(
            address, self.model, self.fingerprint, self.scale.wire_copies, self.scale.wire_repeats
        )
        self.results["wire"] = {"bytes": self.wire.num_bytes, "mib_per_s": self.wire.mib_per_s}
        self.md += [
            "## Wire: embedding slices over gRPC vs raw loopback TCP\n",
            f"{self.wire.num_bytes / 2**20:.0f} MiB per run.\n",
            wire.table(self.wire),
            "",
        ]

    def step_suite(self) -> None:
        out = self.args.out / "step.json"
        quick = ["--repeats", "1", "--batch-sizes", "1", "4"] if self.args.quick else []
        command = [sys.executable, "-m", "benchmarks.step", "--model", self.model]
        subprocess.run([*command, "--json", str(out), *quick], check=True)
        self.step = json.loads(out.read_text())
        self.results["step"] = self.step
        self.md += [
            "## Decode step by batch size (the decoder's engine, in a process of its own)\n",
            f"Prompts of {self.step['prompt_tokens']} tokens; generate(): "
            f"{self.step['generate_ms']:.2f} ms per token; the engine's linears: "
            f"{self.step['linear_kernel']}.\n",
            self.step["table"],
            "",
        ]

    def video_suite(self) -> None:
        out = self.args.out / "video.json"
        command = [sys.executable, "-m", "benchmarks.video", "--json", str(out)]
        if self.args.family in VIDEO_FAMILIES:  # else it makes its own Qwen2.5-VL model
            command += ["--model", self.model]
        if self.args.quick:
            command += ["--requests", "6", "--seconds", "10", "30"]
        subprocess.run(command, check=True)
        self.video = json.loads(out.read_text())
        self.results["video"] = self.video["cell"]
        self.md += [
            "## Video: rows per chunk vs the whole video per chunk (in a process of its own)\n",
            self.video["table"],
            "",
            self.video["section"],
        ]

    def growth_suite(self) -> None:
        results = growth.measure(
            self.runner,
            [self.hf, self.tessera, *self.extra_arms],
            self.scale.growth_repeats,
            self.scale.growth_values,
        )
        self.results["growth"] = [
            {"axis": s.axis, "value": s.value, **c.summary()} for s, c in results
        ]
        self.md += [
            "## Cost growth (one request at a time, fresh images)\n",
            growth.table(
                results, self.hf.name, self.tessera.name, [a.name for a in self.extra_arms]
            ),
            "",
        ]

    def fleet_suite(self) -> None:
        s = self.scale
        self.fleet_results = fleet.run_workloads(
            self.runner,
            self.fleet,
            self.no_cache,
            s.fleet_requests,
            s.fleet_pool,
            s.fleet_verify_every,
        )
        from tessera.hashing import model_fingerprint

        batching = fleet.batching(
            {n: self.cluster.address(n) for n in ("batch-on", "batch-off")},
            model_fingerprint(Path(self.model)),
            s.batching_items,
        )
        self.results["fleet"] = fleet.summary(self.fleet_results, batching)
        self.md += [
            "## Encoder fleet (issue 4)\n",
            fleet.fleet_table(self.fleet_results, "fleet", "no-cache"),
            "",
            fleet.batching_table(batching),
            "",
        ]

    def disagg_suite(self) -> None:
        results = disagg.measure(
            self.runner, self.colocated, self.tessera, self.scale.disagg_requests
        )
        self.results["disagg"] = [c.summary() for c in results]
        self.md += [
            "## When disaggregation pays off: colocated vs tessera\n",
            disagg.table(results, self.colocated.name, self.tessera.name),
            "",
            *map(report.cell_section, results),
        ]

    def targets(self) -> None:
        cells = [*getattr(self, "cells", []), *getattr(self, "chunk_cells", [])]
        if not cells:
            return
        fleet_passes = None
        for result in getattr(self, "fleet_results", []):
            c = result.counters
            passes = c["num_items_computed"] / max(1, result.cell.num_unique_items)
            fleet_passes = passes if fleet_passes is None else max(fleet_passes, passes)
        itl = next((r for r in getattr(self, "latency", []) if r.chunk_tokens == 128), None)
        wire_result = getattr(self, "wire", None)
        runner = self.runner
        table, records = report.targets(
            cells,
            fleet_passes,
            itl.p99_over_p50 if itl else None,
            128,
            wire_result.ratios()["decoder client"] if wire_result else None,
            wire_result.ratios()["grpc stream"] if wire_result else None,
            (runner.num_checked, runner.num_cross_checked),
            sum(a.num_near_ties for c in cells for a in c.arms.values()),
        )
        self.results["targets"] = records
        self.md[:0] = ["## Targets (docs/design.md)\n", table, ""]


def role_certificates() -> dict[str, TlsFiles]:
    """A throwaway CA and a certificate per role (`tessera serve --tls auto`'s kind)."""
    from tessera.certs import write_role_certificates

    return write_role_certificates(Path(tempfile.mkdtemp(prefix="tessera-bench-tls-")))


def takes_audio(reference: Reference) -> bool:
    return hasattr(reference.model.config, "audio_config")


def main() -> int:
    args = parse_args(__doc__.splitlines()[0])
    plots.require_matplotlib()
    args.out.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, scale_of(args))
    started = time.perf_counter()
    failed = run_bench(bench, args.suites)
    bench.targets()
    if failed:
        bench.results["failed_suites"] = failed
        bench.md[:0] = report.failed_suites_section(failed)
    bench.env["duration_s"] = round(time.perf_counter() - started)
    print("\n" + report.write(args.out, bench.env, bench.results, bench.md))
    if failed:
        print(f"FAILED suites: {', '.join(failed)} (results.md lists why)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
