"""A clock a test moves by hand, for code that takes a `clock` callable (the breaker's
backoff, leases): time-dependent edges without sleeping."""

from __future__ import annotations


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
