"""Gathering concurrent encode work into one forward.

Items submitted while the model is busy, or within `max_wait_ms` of the first one, run
together in a single vision forward of at most `max_batch_items`. Waiting only applies
when a batch is not already full; with one request at a time the added latency is at
most `max_wait_ms`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

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


class Batcher(Generic[Item, Result]):
    """`await submit(item)` -> that item's result from `run_batch(items)`, which runs on
    one worker thread and returns one result or exception per item, in order."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[Item]], list[Result | Exception]],
        max_batch_items: int,
        max_wait_ms: float,
    ):
        self._run_batch = run_batch
        self.max_batch_items = max_batch_items
        self.max_wait_seconds = max_wait_ms / 1000
        self.stats = BatchStats()
        self._queue: asyncio.Queue[tuple[Item, asyncio.Future[Result]]] = asyncio.Queue()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._task: asyncio.Task[None] | None = None

    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    async def submit(self, item: Item) -> Result:
        if self._task is None:
            self._task = asyncio.create_task(self._run_forever(), name="encode-batcher")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        await self._queue.put((item, future))
        return await future

    async def _run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_seconds
            while len(batch) < self.max_batch_items:
                timeout = deadline - loop.time()
                if timeout <= 0 and self._queue.empty():
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), max(timeout, 0)))
                except TimeoutError:
                    break
            batch = [(item, future) for item, future in batch if not future.cancelled()]
            if not batch:
                continue
            self.stats.record(len(batch))
            started = loop.time()
            try:
                outcomes = await loop.run_in_executor(
                    self._thread, self._run_batch, [item for item, _ in batch]
                )
            except Exception as error:  # the model failed: every waiter hears of it
                outcomes = [RuntimeError(f"encoding failed: {error}")] * len(batch)
            self.stats.busy_seconds += loop.time() - started
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.cancelled():
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
