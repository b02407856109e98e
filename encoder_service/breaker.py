"""Down/up state for a dependency that may fail (Redis), so that a dead one costs one
timeout per backoff period instead of one per call, and is probed by one call at a time."""

from __future__ import annotations

from collections.abc import Callable


class CircuitBreaker:
    """Down/up state with exponential backoff and a single probe after each period."""

    def __init__(self, start_s: float, max_s: float, clock: Callable[[], float]):
        self._start_s = start_s
        self._max_s = max_s
        self._clock = clock
        self.down = False
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._probing = False

    def admit(self) -> bool | None:
        """None: reject without touching Redis; else whether this call is the probe."""
        if not self.down:
            return False
        if self._probing or self._clock() < self._retry_at:
            return None
        self._probing = True
        return True

    def succeeded(self) -> None:
        self.down = False
        self._probing = False
        self._backoff_s = 0.0

    def failed(self, probe: bool) -> bool:
        """Records a failure; returns True when the store just went down."""
        if self.down and not probe:
            # A call already in flight when Redis went down: the period already runs.
            return False
        went_down = not self.down
        self._backoff_s = self._start_s if went_down else min(self._backoff_s * 2, self._max_s)
        self.down = True
        self._probing = False
        self._retry_at = self._clock() + self._backoff_s
        return went_down

    def abandoned(self, probe: bool) -> None:
        """A call that ended without a verdict (cancelled, or not a Redis failure)."""
        if probe:
            self._probing = False
