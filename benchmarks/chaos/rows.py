"""One fault under load: the row's timeline and the figures docs/reliability.md shows.

Timeline: load starts; `pre` seconds later the fault is injected; it is held; the
recovery runs (restart, resume, heal...); the load goes on until a request sent after
the recovery has finished exactly (bounded), then `post` seconds more; in-flight
requests finish within their deadline.
"""

from __future__ import annotations

import collections
import time
from dataclasses import asdict, dataclass

from benchmarks.chaos.faults import Fault
from benchmarks.chaos.load import OpenLoop, Outcome
from tessera.testbed.control import FleetControl

PRE_SECONDS = 3.0
POST_SECONDS = 3.0
MAX_RECOVERY_SECONDS = 90.0


@dataclass
class RowFigures:
    fault: str
    what: str
    keeps_every_role: bool
    num_sent: int = 0
    num_exact: int = 0
    num_failed: int = 0
    failed_by_status: dict[str, int] | None = None
    num_retried: int = 0
    num_wrong: int = 0
    recovery_seconds: float | None = None  # recovery done -> first exact answer sent after
    max_latency_seconds: float = 0.0
    client_saw: str = ""
    skipped: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def judge(
    fault: Fault, outcomes: list[Outcome], answers: dict[int, list[int]], recovered_at: float
) -> RowFigures:
    figures = RowFigures(fault.name, fault.what, fault.keeps_every_role)
    figures.num_sent = len(outcomes)
    failures = collections.Counter()
    details: dict[str, str] = {}
    for outcome in outcomes:
        figures.num_retried += outcome.num_retries > 0
        figures.max_latency_seconds = max(
            figures.max_latency_seconds, outcome.ended_at - outcome.sent_at
        )
        if not outcome.ok:
            failures[outcome.status] += 1
            details.setdefault(outcome.status, outcome.detail[:120])
        elif outcome.token_ids == answers[outcome.variant]:
            figures.num_exact += 1
        else:
            figures.num_wrong += 1
    figures.num_failed = sum(failures.values())
    figures.failed_by_status = dict(failures)
    after = [o for o in outcomes if o.sent_at >= recovered_at and o.ok]
    if after:
        first = min(after, key=lambda o: o.ended_at)
        figures.recovery_seconds = max(0.0, first.ended_at - recovered_at)
    figures.client_saw = _client_saw(figures, failures, details)
    return figures


def _client_saw(figures: RowFigures, failures: collections.Counter, details: dict) -> str:
    latency = f"slowest answer {figures.max_latency_seconds:.1f} s"
    if not failures:
        return f"every request answered; {latency}"
    parts = [f"{count} x {status} ({details[status]})" for status, count in failures.items()]
    return "; ".join(parts) + f"; {latency}"


def run_row(
    fleet: FleetControl, fault: Fault, answers: dict[int, list[int]], rate_per_second: float
) -> RowFigures:
    load = OpenLoop(fleet.gateway_address, fault.name, rate_per_second).start()
    time.sleep(PRE_SECONDS)
    fault.inject(fleet)
    time.sleep(fault.hold_seconds)
    fault.recover(fleet)
    recovered_at = time.monotonic()
    deadline = recovered_at + MAX_RECOVERY_SECONDS
    while time.monotonic() < deadline and not any(
        o.ok and o.sent_at >= recovered_at for o in list(load.outcomes)
    ):
        time.sleep(0.2)
    time.sleep(POST_SECONDS)
    return judge(fault, load.stop(), answers, recovered_at)


def skipped_row(fault: Fault, reason: str) -> RowFigures:
    return RowFigures(fault.name, fault.what, fault.keeps_every_role, skipped=reason)
