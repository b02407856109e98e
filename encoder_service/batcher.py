"""Gathering concurrent encode work into one forward, the smallest caller's first.

Items submitted while the model is busy, or within `max_wait_ms` of the first one, run
together in a single forward of at most `max_batch_items` and `max_batch_cost` (an
image's cost is its pixels: decoding and resizing take time in proportion to them).
Waiting only applies when a batch is not already full; with one request at a time the
added latency is at most `max_wait_ms`. `hurry` ends the wait of the batch gathering (or
of the next one, if none is): a decoder idles until an item of it is done
(encoder_service.expedite).

Each caller (an Encode call's lease owner: one request) has its own queue, and a batch
takes items from the caller with the least work queued first (cost, then items, then who
came first), as the decoder's scheduler prefills the prompt closest to its first token
first. A one-image request therefore runs before the rest of a request of 16 huge
images, and two requests of four images each finish one after the other instead of both
at the end:

    queues:  A: [a1 a2 a3]   B: [b1]        (each a* costs the whole batch budget)
    batches: [b1]  [a1]  [a2]  [a3]         (FIFO would have run b1 last)

    queues:  A: [a1 a2]   B: [b1 b2]        (one item per forward)
    batches: [a1]  [a2]  [b1]  [b2]         (turn by turn, A's last row came third)

So that a large request is not held back for ever by a stream of small ones, a caller
passed over by `max_passed_over` forwards in a row goes first.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tessera.compute_thread import compute_thread
from tessera.loop_guard import run_guarded

log = logging.getLogger("tessera.encoder")

# Forwards in a row a caller's items may wait behind callers with less work queued.
DEFAULT_MAX_PASSED_OVER = 16

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class BatchStats:
    num_batches: int = 0
    num_items: int = 0
    max_batch_size: int = 0
    busy_seconds: float = 0.0
    num_errors: int = 0  # batches failed by a bug around the model (`_run_forever`)
    # batch size -> how many batches had it
    histogram: dict[int, int] = field(default_factory=dict)

    def record(self, size: int) -> None:
        self.num_batches += 1
        self.num_items += size
        self.max_batch_size = max(self.max_batch_size, size)
        self.histogram[size] = self.histogram.get(size, 0) + 1


@dataclass
class _Waiting(Generic[Item, Result]):
    item: Item
    future: asyncio.Future[Result]
    cost: int


@dataclass
class _CallerQueue(Generic[Item, Result]):
    arrival: int  # breaks ties: the caller that queued first
    waiting: deque[_Waiting[Item, Result]] = field(default_factory=deque)
    cost: int = 0  # of the items waiting
    passed_over: int = 0  # forwards in a row that took none of its items


class Batcher(Generic[Item, Result]):
    """`await submit(item, caller)` -> that item's result from `run_batch(items)`, which
    runs on one worker thread and returns one result or exception per item, in order.
    `max_batch_cost` 0 means no cost bound; the first item of a batch always runs."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[Item]], list[Result | Exception]],
        max_batch_items: int,
        max_wait_ms: float,
        cost: Callable[[Item], int] = lambda item: 0,
        max_batch_cost: int = 0,
        max_passed_over: int = DEFAULT_MAX_PASSED_OVER,
        on_batch_start: Callable[[Sequence[Item]], None] = lambda items: None,
        on_batch_end: Callable[[Sequence[Item]], None] = lambda items: None,
    ):
        self._run_batch = run_batch
        self.max_batch_items = max_batch_items
        self.max_wait_seconds = max_wait_ms / 1000
        self._cost = cost
        self.max_batch_cost = max_batch_cost
        self.max_passed_over = max_passed_over
        self.stats = BatchStats()
        self._queues: dict[Hashable, _CallerQueue[Item, Result]] = {}
        self._num_callers_seen = 0
        self._num_queued = 0
        self._queued_cost = 0
        self._arrived = asyncio.Event()
        self._hurried = False
        self._task: asyncio.Task[None] | None = None
        self._taken: list[_Waiting[Item, Result]] = []  # the batch running, for `_fail_taken`
        # Called on the event loop around each batch's run (encoder_service.expedite).
        self._on_batch_start = on_batch_start
        self._on_batch_end = on_batch_end

    @property
    def queue_depth(self) -> int:
        return self._num_queued

    def hurry(self) -> None:
        """The batch gathering now (else the next one) runs without waiting to fill."""
        self._hurried = True
        self._arrived.set()

    async def submit(self, item: Item, caller: Hashable) -> Result:
        if self._task is None:
            self._task = asyncio.create_task(self._run_forever(), name="encode-batcher")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        waiting = _Waiting(item, future, self._cost(item))
        queue = self._queues.get(caller)
        if queue is None:
            queue = self._queues[caller] = _CallerQueue(self._num_callers_seen)
            self._num_callers_seen += 1
        queue.waiting.append(waiting)
        queue.cost += waiting.cost
        self._num_queued += 1
        self._queued_cost += waiting.cost
        self._arrived.set()
        return await future

    async def _run_forever(self) -> None:
        """Batch after batch. Nothing raised here may end the loop (every encode, queued
        and yet to come, would hang): the model's errors are the batch's outcomes; any
        other is a bug, logged, its batch failed, and the loop goes on after a pause."""
        await run_guarded(self._turn, self._fail_taken)

    async def _turn(self) -> None:
        await self._gather()
        self._taken = self._take_batch()
        if self._taken:
            await self._run(self._taken)
        self._taken = []

    def _fail_taken(self) -> None:
        log.exception("the encode batcher failed (a bug); failing its batch")
        self.stats.num_errors += 1
        error = RuntimeError("internal error in the encoder's batcher (logged)")
        for waiting in self._taken:
            if not waiting.future.done():
                waiting.future.set_exception(error)
        self._taken = []

    async def _run(self, batch: list[_Waiting[Item, Result]]) -> None:
        self.stats.record(len(batch))
        items = [waiting.item for waiting in batch]
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._on_batch_start(items)
        try:
            # The model runs on the process's one torch thread (compute_thread).
            outcomes = await compute_thread().run(self._run_batch, items)
        except Exception as error:  # the model failed: every waiter hears of it
            outcomes = [RuntimeError(f"encoding failed: {error}")] * len(batch)
        finally:
            self._on_batch_end(items)
        self.stats.busy_seconds += loop.time() - started
        for waiting, outcome in zip(batch, outcomes, strict=True):
            if waiting.future.done():  # cancelled: its caller is gone
                continue
            if isinstance(outcome, Exception):
                waiting.future.set_exception(outcome)
            else:
                waiting.future.set_result(outcome)

    async def _gather(self) -> None:
        """Returns once an item waits and either a batch is full or `max_wait_ms` has
        passed since the first arrived."""
        while not self._num_queued:
            self._arrived.clear()
            await self._arrived.wait()
        deadline = asyncio.get_running_loop().time() + self.max_wait_seconds
        while not self._full() and not self._hurried:
            timeout = deadline - asyncio.get_running_loop().time()
            if timeout <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except TimeoutError:
                return

    def _full(self) -> bool:
        over_cost = self.max_batch_cost and self._queued_cost >= self.max_batch_cost
        return self._num_queued >= self.max_batch_items or bool(over_cost)

    def _take_batch(self) -> list[_Waiting[Item, Result]]:
        """Items of the callers in `_turn_order`, while the batch has room; a caller passed
        over counts it. Cancelled waiters are dropped."""
        self._hurried = False
        batch: list[_Waiting[Item, Result]] = []
        batch_cost = 0
        served: set[Hashable] = set()
        for caller, queue in self._turn_order():
            while queue.waiting and len(batch) < self.max_batch_items:
                waiting = queue.waiting[0]
                fits = not self.max_batch_cost or batch_cost + waiting.cost <= self.max_batch_cost
                if batch and not fits:
                    break
                queue.waiting.popleft()
                queue.cost -= waiting.cost
                self._num_queued -= 1
                self._queued_cost -= waiting.cost
                served.add(caller)
                if not waiting.future.cancelled():
                    batch.append(waiting)
                    batch_cost += waiting.cost
            if queue.waiting:  # the batch is full: nobody after this caller fits
                break
        for caller, queue in list(self._queues.items()):
            if not queue.waiting:
                del self._queues[caller]
            else:
                queue.passed_over = 0 if caller in served else queue.passed_over + 1
        return batch

    def _turn_order(self) -> list[tuple[Hashable, _CallerQueue[Item, Result]]]:
        """Callers passed over too often first, the first come first; then the least
        work waiting first."""

        def key(entry: tuple[Hashable, _CallerQueue[Item, Result]]) -> tuple[int, ...]:
            queue = entry[1]
            if queue.passed_over >= self.max_passed_over:
                return (0, queue.arrival)
            return (1, queue.cost, len(queue.waiting), queue.arrival)

        return sorted(self._queues.items(), key=key)
