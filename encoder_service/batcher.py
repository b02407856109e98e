"""Gathering concurrent encode work into one forward, fairly between callers.

Items submitted while the model is busy, or within `max_wait_ms` of the first one, run
together in a single forward of at most `max_batch_items` and `max_batch_cost` (an
image's cost is its pixels: decoding and resizing take time in proportion to them).
Waiting only applies when a batch is not already full; with one request at a time the
added latency is at most `max_wait_ms`.

Each caller (an Encode call's lease owner: one request) has its own queue, and batches
take items from the queues in turn. A request of 16 huge images therefore runs as 16
batches with everyone else's items between them, instead of holding the model for all
16 while a one-image request waits:

    queues:  A: [a1 a2 a3]   B: [b1]        (each a* costs the whole batch budget)
    batches: [a1]  [b1]  [a2]  [a3]          (FIFO would have run b1 last)
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tessera.compute_thread import compute_thread

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class BatchStats:
    num_batches: int = 0
    num_items: int = 0
    max_batch_size: int = 0
    busy_seconds: float = 0.0
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
    ):
        self._run_batch = run_batch
        self.max_batch_items = max_batch_items
        self.max_wait_seconds = max_wait_ms / 1000
        self._cost = cost
        self.max_batch_cost = max_batch_cost
        self.stats = BatchStats()
        self._queues: OrderedDict[Hashable, deque[_Waiting[Item, Result]]] = OrderedDict()
        self._num_queued = 0
        self._queued_cost = 0
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def queue_depth(self) -> int:
        return self._num_queued

    async def submit(self, item: Item, caller: Hashable) -> Result:
        if self._task is None:
            self._task = asyncio.create_task(self._run_forever(), name="encode-batcher")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        waiting = _Waiting(item, future, self._cost(item))
        self._queues.setdefault(caller, deque()).append(waiting)
        self._num_queued += 1
        self._queued_cost += waiting.cost
        self._arrived.set()
        return await future

    async def _run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._gather()
            batch = self._take_batch()
            if not batch:
                continue
            self.stats.record(len(batch))
            started = loop.time()
            try:
                # The model runs on the process's one torch thread (compute_thread).
                outcomes = await compute_thread().run(
                    self._run_batch, [waiting.item for waiting in batch]
                )
            except Exception as error:  # the model failed: every waiter hears of it
                outcomes = [RuntimeError(f"encoding failed: {error}")] * len(batch)
            self.stats.busy_seconds += loop.time() - started
            for waiting, outcome in zip(batch, outcomes, strict=True):
                if waiting.future.cancelled():
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
        while not self._full():
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
        """One item from each caller's queue in turn, while the batch has room; a caller
        served goes to the back of the turn order. Cancelled waiters are dropped."""
        batch: list[_Waiting[Item, Result]] = []
        batch_cost = 0
        while self._queues and len(batch) < self.max_batch_items:
            caller, queue = next(iter(self._queues.items()))
            waiting = queue[0]
            fits = not self.max_batch_cost or batch_cost + waiting.cost <= self.max_batch_cost
            if batch and not fits:
                break
            queue.popleft()
            self._num_queued -= 1
            self._queued_cost -= waiting.cost
            if queue:
                self._queues.move_to_end(caller)
            else:
                del self._queues[caller]
            if not waiting.future.cancelled():
                batch.append(waiting)
                batch_cost += waiting.cost
        return batch
