"""The order of a request's two dispatches: the decode request goes to a decoder only
once every encoder has announced the request's items in flight (`Encode`'s early initial
metadata), so the decoder's first fetch finds them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Countdown:
    """Sets `done` once each of `count` parties has ticked (`one()`: a party's tick,
    counted once however often it is called)."""

    def __init__(self, count: int, done: asyncio.Event):
        self.count, self.done = count, done

    def one(self) -> Callable[[], None]:
        ticked = False

        def tick() -> None:
            nonlocal ticked
            if not ticked:
                ticked = True
                self.count -= 1
                if self.count <= 0:
                    self.done.set()

        return tick


async def until_dispatched(dispatched: asyncio.Event, encode_task: asyncio.Task) -> None:
    """Until the encoders have the request's items in flight, so the decode request goes
    out only then: a decoder fetching sooner can find nothing and send each item's bytes
    to be encoded a second time (docs/design.md, data flow step 2, says when it did). An
    encoder that does not announce (an older one) ends the wait when its Encode ends."""
    if dispatched.is_set():
        return
    waiter = asyncio.ensure_future(dispatched.wait())
    try:
        await asyncio.wait([waiter, encode_task], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
