"""`make soak`: the chaos mix with no faults for a long time (30 minutes by default),
the RSS of every process sampled, checked against a growth bound, plotted; then nothing
may be held (KV blocks, pins, compute leases).

    python -m benchmarks.chaos.soak [--minutes 30] [--rate 4] [--loopback]

Bound: after warm-up (the first fifth of the run: caches fill, allocators settle), a
process may grow by at most 10% of its warm RSS plus 64 MiB; a leak of one request's
worth per request (thousands of requests) passes that within minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.chaos import report
from benchmarks.chaos.faults import Fault, no_action
from benchmarks.chaos.fleets import demo_model, start_fleet
from benchmarks.chaos.load import OpenLoop, healthy_answers
from benchmarks.chaos.rows import judge
from benchmarks.common import environment
from tessera.testbed import leaks

DOCS = Path(__file__).resolve().parents[2] / "docs"
SAMPLE_SECONDS = 5.0
WARMUP_FRACTION = 0.2
GROWTH_FRACTION = 0.10
GROWTH_MIB = 64.0
BOUND = f"{GROWTH_FRACTION:.0%} of its RSS after warm-up + {GROWTH_MIB:.0f} MiB"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_figures(samples: list[tuple[float, dict[str, float]]]) -> dict[str, dict]:
    warm_index = min(len(samples) - 1, int(len(samples) * WARMUP_FRACTION))
    figures = {}
    for name in samples[0][1]:
        start, warm, end = (samples[i][1][name] for i in (0, warm_index, -1))
        growth = end - warm
        figures[name] = {
            "start_mib": start,
            "warm_mib": warm,
            "end_mib": end,
            "growth_mib": growth,
            "within_bound": growth <= GROWTH_FRACTION * warm + GROWTH_MIB,
        }
    return figures


def plot(samples: list[tuple[float, dict[str, float]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    minutes = [t / 60 for t, _ in samples]
    for name in samples[0][1]:
        axes.plot(minutes, [values[name] for _, values in samples], label=name)
    axes.set_xlabel("minutes")
    axes.set_ylabel("RSS (MiB)")
    axes.set_title("RSS of every process under steady mixed load")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos.soak",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the load runs")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--model", default="", help="checkpoint; a generated demo if empty")
    parser.add_argument("--loopback", action="store_true", help="no test hosts: loopback only")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where reliability.md goes")
    return parser.parse_args(argv)


def soak(fleet, args) -> tuple[list, list]:
    """Runs the load for `args.minutes`; returns (RSS samples, outcomes)."""
    pids = {name: fleet.pid(name) for name in fleet.procs}
    max_requests = int(args.rate * args.minutes * 60) + 1
    load = OpenLoop(fleet.gateway_address, "soak", args.rate, max_requests=max_requests)
    started = time.monotonic()
    samples = []
    load.start()
    next_report = 60.0
    while (elapsed := time.monotonic() - started) < args.minutes * 60:
        samples.append((elapsed, {name: rss_mib(pid) for name, pid in pids.items()}))
        if elapsed >= next_report:
            largest = max(samples[-1][1].items(), key=lambda item: item[1])
            print(
                f"soak: {elapsed / 60:.0f}/{args.minutes:.0f} min, {load.num_sent} sent, "
                f"largest RSS {largest[0]} {largest[1]:.0f} MiB",
                flush=True,
            )
            next_report += 60.0
        time.sleep(SAMPLE_SECONDS)
    return samples, load.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = args.model or demo_model()
    env = environment(model, sys.argv[1:] if argv is None else argv)
    env["command"] = " ".join(["python -m benchmarks.chaos.soak", *(argv or sys.argv[1:])])
    print(f"soak: starting the fleet for {args.minutes:g} minutes of load...", flush=True)
    fleet, network = start_fleet(model, args.loopback)
    try:
        answers = healthy_answers(fleet.gateway_address)
        samples, outcomes = soak(fleet, args)
        held = leaks.wait_quiet(fleet, max_seconds=60)
    finally:
        fleet.stop()
    run = Fault("soak", "steady mixed load", no_action, no_action, 0)
    figures = judge(run, outcomes, answers, recovered_at=0.0)
    results_dir = args.docs / "reliability"
    results_dir.mkdir(parents=True, exist_ok=True)
    plot(samples, results_dir / "soak_rss.png")
    results = {
        "command": env["command"],
        "environment": env,
        "network": network,
        "minutes": args.minutes,
        "rate": args.rate,
        "warmup_fraction": WARMUP_FRACTION,
        "bound": BOUND,
        "figures": figures.as_dict(),
        "processes": process_figures(samples),
        "leaks": held,
    }
    (results_dir / "soak.json").write_text(json.dumps(results, indent=1))
    print(f"soak: wrote {report.write(args.docs)}", flush=True)
    if held or not all(p["within_bound"] for p in results["processes"].values()):
        raise SystemExit("soak: memory grew past its bound or something was held at the end")


if __name__ == "__main__":
    main()
