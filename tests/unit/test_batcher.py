"""The encoder's batcher: callers take turns, a batch stays within its item and cost
bounds. The model is a function that records each batch; a threading event holds the
first batch until the test has queued what it needs, so no outcome depends on timing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from encoder_service.batcher import Batcher


class Recorder:
    """run_batch for a Batcher: records every batch; the first waits for `release`."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.first_started = threading.Event()

    def __call__(self, items: Sequence[str]) -> list[str]:
        if not self.batches:
            self.first_started.set()
            self.release.wait(30)
        self.batches.append(list(items))
        return [item.upper() for item in items]


def cost_of(item: str) -> int:
    """ "big-..." items cost the whole batch budget of 100, others 1."""
    return 100 if item.startswith("big") else 1


async def run_while_held(recorder: Recorder, batcher: Batcher, first, queued) -> list:
    """Submits `first` (caller, item) pairs, waits until the first batch runs and holds
    it, submits `queued` behind it, releases, and returns every result."""
    tasks = [asyncio.ensure_future(batcher.submit(item, caller)) for caller, item in first]
    await asyncio.to_thread(recorder.first_started.wait, 30)
    tasks += [asyncio.ensure_future(batcher.submit(item, caller)) for caller, item in queued]
    await asyncio.sleep(0)  # the submissions queue their items
    recorder.release.set()
    return await asyncio.gather(*tasks)


def test_a_small_request_runs_between_the_batches_of_a_huge_one():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 16, 0.0, cost=cost_of, max_batch_cost=100)
        huge = [("A", f"big-{index}") for index in range(5)]
        return await run_while_held(recorder, batcher, huge[:1], [*huge[1:], ("B", "small")])

    results = asyncio.run(scenario())
    assert results == ["BIG-0", "BIG-1", "BIG-2", "BIG-3", "BIG-4", "SMALL"]
    # FIFO would have run "small" after every big image of A.
    assert recorder.batches == [["big-0"], ["big-1"], ["small"], ["big-2"], ["big-3"], ["big-4"]]


def test_callers_take_turns_within_a_batch():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 4, 0.0)
        queued = [("A", "a1"), ("A", "a2"), ("A", "a3"), ("B", "b1"), ("C", "c1"), ("C", "c2")]
        return await run_while_held(recorder, batcher, [("A", "a0")], queued)

    asyncio.run(scenario())
    assert recorder.batches == [["a0"], ["a1", "b1", "c1", "a2"], ["c2", "a3"]]


def test_cheap_items_fill_a_batch_up_to_the_cost_bound():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 16, 0.0, cost=lambda item: 40, max_batch_cost=100)
        queued = [("A", f"a{index}") for index in range(1, 6)]
        return await run_while_held(recorder, batcher, [("A", "a0")], queued)

    asyncio.run(scenario())
    assert recorder.batches == [["a0"], ["a1", "a2"], ["a3", "a4"], ["a5"]]


def test_without_a_cost_bound_a_batch_takes_up_to_max_items():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 3, 0.0, cost=cost_of)
        queued = [("A", f"big-{index}") for index in range(1, 5)]
        return await run_while_held(recorder, batcher, [("A", "big-0")], queued)

    asyncio.run(scenario())
    assert recorder.batches == [["big-0"], ["big-1", "big-2", "big-3"], ["big-4"]]


def test_a_cancelled_waiter_is_dropped_and_the_others_still_run():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 4, 0.0)
        first = asyncio.ensure_future(batcher.submit("a0", "A"))
        await asyncio.to_thread(recorder.first_started.wait, 30)
        gone = asyncio.ensure_future(batcher.submit("gone", "B"))
        kept = asyncio.ensure_future(batcher.submit("kept", "C"))
        await asyncio.sleep(0)
        gone.cancel()
        recorder.release.set()
        return await asyncio.gather(first, kept), batcher.queue_depth

    results, depth = asyncio.run(scenario())
    assert results == ["A0", "KEPT"] and depth == 0
    assert recorder.batches == [["a0"], ["kept"]]
