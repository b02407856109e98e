"""The flags of `python -m benchmarks.run` and the checks between them."""

from __future__ import annotations

import argparse
import dataclasses
import traceback
from collections.abc import Sequence
from pathlib import Path

from benchmarks.scale import FULL, QUICK, Scale
from tessera.demo_models import AUDIO_DEMO_FAMILIES
from tessera.testbed.devices import DTYPES

SUITES = [
    *("arms", "chunks", "poisson", "latency", "wire", "step", "ceiling", "growth", "fleet"),
    *("disagg", "video"),
]
# Suites whose workloads are images whatever the family (latency: 4 items of a prompt
# in one chunk, beyond a context of 30 s clips; ceiling: the vision pass of one image).
IMAGE_ONLY_SUITES = ("latency", "ceiling", "growth", "wire", "fleet", "disagg")
# Suites that compare the baseline arms (the others need only generate() and tessera).
BASELINE_SUITES = ("arms", "chunks", "poisson", "fleet")
# Suites that start processes of their own rather than use the run's deployments. They run
# once those are stopped: the two sets together took more than this 24 GB host's memory
# (no swap), and the kernel's reclaim at 100% system CPU stalled video requests for a
# minute and made the gateway refuse a clip as too slow to decode.
OWN_PROCESS_SUITES = ("step", "ceiling", "video")
# Suites that reach the services only through ServiceArm (which takes the TLS files).
TLS_SUITES = ("arms", "chunks", "poisson", "growth")


def parse_args(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", help="checkpoint (default: a fresh bench demo model)")
    parser.add_argument(
        "--family",
        default="llava",
        help="family of the bench demo model made when no --model is given (default: llava)",
    )
    parser.add_argument(
        "--image-sides",
        type=int,
        nargs=2,
        metavar=("MIN", "MAX"),
        help="image sides in px the workloads draw from (default: by family)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer requests (< 5 minutes)")
    parser.add_argument(
        "--growth-repeats",
        type=int,
        help="requests per setting of the growth table (default: 8, 1 with --quick); more "
        "for steadier medians on a busy machine",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--redis-url", help="the tessera arm's encoder also uses this Redis")
    parser.add_argument(
        "--device", default="cpu", help="torch device of every arm (reencode-per-chunk: cpu only)"
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=list(DTYPES),
        help="dtype of every arm; generate() runs in it too, so outputs are compared in one dtype",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help=f"mutual TLS on every service arm's hops (suites {', '.join(TLS_SUITES)})",
    )
    parser.add_argument(
        "--encoder-flags",
        default="",
        help="more flags for the tessera arm's encoder, e.g. \"--trust-content-hashes-from=''\"",
    )
    parser.add_argument(
        "--growth-compare-encoder-flags",
        help="the growth table also runs tessera-b, a second deployment whose encoder gets "
        "these flags, request by request beside the others (e.g. "
        "--trust-content-hashes-from= with --tls: the hash check's cost)",
    )
    parser.add_argument("--suites", nargs="+", choices=SUITES, default=SUITES)
    args = parser.parse_args(argv)
    if args.growth_compare_encoder_flags is not None and "growth" not in args.suites:
        parser.error("--growth-compare-encoder-flags: add growth to --suites")
    if args.tls and set(args.suites) - set(TLS_SUITES):
        parser.error(f"--tls: choose from --suites {' '.join(TLS_SUITES)}")
    image_only = sorted(set(args.suites) & set(IMAGE_ONLY_SUITES))
    if args.family in AUDIO_DEMO_FAMILIES and not args.model and image_only:
        parser.error(
            f"suites {', '.join(image_only)} send images; with --family {args.family} "
            "choose from --suites arms chunks poisson"
        )
    return args


def scale_of(args: argparse.Namespace) -> Scale:
    """The run's scale: --quick or full, with --growth-repeats if given."""
    scale = QUICK if args.quick else FULL
    if args.growth_repeats:
        scale = dataclasses.replace(scale, growth_repeats=args.growth_repeats)
    return scale


def run_bench(bench: object, suites: Sequence[str]) -> dict[str, str]:
    """Starts `bench`'s deployments, runs the chosen suites that use them, stops them, then
    runs the chosen OWN_PROCESS_SUITES; the suites' errors by name, as `run_suites`."""
    try:
        bench.start()
        failed = run_suites(bench, [s for s in suites if s not in OWN_PROCESS_SUITES])
    finally:
        bench.stop()
    return failed | run_suites(bench, [s for s in suites if s in OWN_PROCESS_SUITES])


def run_suites(bench: object, suites: Sequence[str]) -> dict[str, str]:
    """Runs the chosen suites of `bench` (a `benchmarks.run.Bench`: its `<suite>_suite`
    methods) in SUITES order. One that raises has its traceback printed and its error
    returned by name, and the next one runs: a run of a quarter hour is not thrown away
    for its last suite. The caller fails the run when any did."""
    failed: dict[str, str] = {}
    for suite in SUITES:
        if suite not in suites:
            continue
        print(f"\n== {suite}", flush=True)
        try:
            getattr(bench, f"{suite}_suite")()
        except Exception as error:  # reported by the caller, which fails the run
            traceback.print_exc()
            failed[suite] = f"{type(error).__name__}: {error}"
    return failed
