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
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks import disagg, fleet, must_show, plots, report
from benchmarks.bench_suites import Suites
from benchmarks.common import bench_model, environment
from benchmarks.inprocess import HfGenerate, ReencodePerChunk
from benchmarks.options import BASELINE_SUITES, parse_args, run_bench, scale_of
from benchmarks.scale import DEFAULT_IMAGE_SIDES, IMAGE_SIDES, Scale
from benchmarks.services import add_deployment
from benchmarks.suite import CellRunner, ModelShape, References
from tessera.testbed.cluster import Cluster
from tessera.testbed.devices import RunOn
from tessera.testbed.redis_server import PrivateRedis
from tessera.testbed.reference import Reference
from tessera.tls import TlsFiles

# Audio families draw clips of 2-30 s instead of images (a Qwen2-Audio window is 30 s).
CLIP_SECONDS = (2.0, 30.0)
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


class Bench(Suites):
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
        self.runner.warm_up([*self.arms, *self.extra_arms])

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
    bench.md[:0] = must_show.section(bench.results)
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
