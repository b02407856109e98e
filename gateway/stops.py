"""Stop strings: generation ends where the text first contains one, which is cut off.

Text is released only once no stop string can still begin in it: with stop "END", the
delta "the E" releases "the " and holds "E" until the next delta shows "EN..." or not.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def add(self, text: str) -> str:
        """The part of `text` (with what was held) that is final; sets `stopped`."""
        if self.stopped:
            return ""
        text = self._held + text
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = self._longest_partial_stop(text)
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_partial_stop(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        best = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), best, -1):
                if stop.startswith(text[-length:]):
                    best = length
                    break
        return best
