"""The pause a service's long-running loop takes after an error it caught.

A loop that serves every request (the decoder's engine, the encoder's batcher) must not
end on an exception: every request, running and yet to come, would hang until its
deadline with nothing in the log. It catches, logs, fails the work it held and goes on;
the pause keeps an error that recurs every turn from spinning a core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

MIN_PAUSE_SECONDS = 0.002
MAX_PAUSE_SECONDS = 1.0


def error_backoff_seconds(num_errors_in_a_row: int) -> float:
    """The pause after the n-th error in a row: 2 ms, doubling, at most 1 s. A one-off
    error costs its work and a blink; one that recurs costs a few hundred turns at most
    before the pause is long. The 1st, 2nd and 3rd errors in a row pause 2, 4 and 8 ms;
    the 10th and later 1 s."""
    num_doublings = min(max(num_errors_in_a_row, 1) - 1, 16)
    return min(MAX_PAUSE_SECONDS, MIN_PAUSE_SECONDS * 2**num_doublings)


async def run_guarded(turn: Callable[[], Awaitable[None]], recover: Callable[[], None]) -> None:
    """`turn()` for ever. An exception from it is handed to `recover()` (called inside
    the `except`, so it may `log.exception`), then the loop pauses
    `error_backoff_seconds` of the errors in a row and goes on; a turn that returns
    resets the count. Only cancellation ends it."""
    num_errors_in_a_row = 0
    while True:
        try:
            await turn()
            num_errors_in_a_row = 0
        except Exception:
            num_errors_in_a_row += 1
            recover()
            await asyncio.sleep(error_backoff_seconds(num_errors_in_a_row))
