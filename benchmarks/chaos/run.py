"""`make chaos`: every fault of the schedule under open-loop load, one row each, into
docs/reliability.md.

    python -m benchmarks.chaos.run [--model M] [--rate 4] [--faults a,b] [--loopback]

Bounded: each row is a few seconds of load before the fault, the fault's hold, the
recovery and at most 90 s more; the whole schedule takes about ten minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.chaos import report
from benchmarks.chaos.faults import schedule
from benchmarks.chaos.fleets import demo_model, heal_everything, start_fleet
from benchmarks.chaos.load import healthy_answers
from benchmarks.chaos.rows import run_row, skipped_row
from benchmarks.common import environment
from tessera.testbed import leaks
from tessera.testbed.fleet import LoopbackFleet

DOCS = Path(__file__).resolve().parents[2] / "docs"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chaos.run",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default="", help="checkpoint; a generated demo if empty")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--faults", default="", help="comma-separated fault names (all if empty)")
    parser.add_argument("--loopback", action="store_true", help="no test hosts: loopback only")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where reliability.md goes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    chosen = [f for f in schedule() if not args.faults or f.name in args.faults.split(",")]
    model = args.model or demo_model()
    env = environment(model, sys.argv[1:] if argv is None else argv)
    env["command"] = " ".join(["python -m benchmarks.chaos.run", *(argv or sys.argv[1:])])
    print(f"chaos: starting the fleet ({len(chosen)} faults)...", flush=True)
    fleet, network = start_fleet(model, args.loopback)
    rows = []
    try:
        answers = healthy_answers(fleet.gateway_address)
        for number, fault in enumerate(chosen, 1):
            if fault.needs_network and isinstance(fleet, LoopbackFleet):
                rows.append(skipped_row(fault, "needs test hosts (network namespaces)"))
                continue
            print(f"chaos: [{number}/{len(chosen)}] {fault.name}: {fault.what}", flush=True)
            started = time.monotonic()
            row = run_row(fleet, fault, answers, args.rate)
            heal_everything(fleet)
            print(
                f"chaos:   {row.num_sent} sent, {row.num_exact} exact, {row.num_failed} failed,"
                f" {row.num_wrong} wrong, {time.monotonic() - started:.0f} s",
                flush=True,
            )
            rows.append(row)
        held = leaks.wait_quiet(fleet, max_seconds=60)
    finally:
        fleet.stop()
    results = {
        "command": env["command"],
        "environment": env,
        "fleet": f"{len(fleet.names('decoder'))} decoders, {len(fleet.names('encoder'))} "
        "encoders, a gateway, one Redis",
        "network": network,
        "rate": args.rate,
        "rows": [row.as_dict() for row in rows],
        "leaks": held,
    }
    out = args.docs / "reliability" / "chaos.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"chaos: wrote {report.write(args.docs)}", flush=True)


if __name__ == "__main__":
    main()
