"""The encoder's batcher: the caller with the least work waiting goes first, one passed
over too often goes before it, a batch stays within its item and cost bounds. The model
is a function that records each batch; a threading event holds the first batch until
the test has queued what it needs, so no outcome depends on timing."""

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
    assert recorder.batches == [["big-0"], ["small"], ["big-1"], ["big-2"], ["big-3"], ["big-4"]]


def test_a_batch_takes_the_callers_with_the_least_work_waiting_first():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 4, 0.0)
        queued = [("A", "a1"), ("A", "a2"), ("A", "a3"), ("B", "b1"), ("C", "c1"), ("C", "c2")]
        return await run_while_held(recorder, batcher, [("A", "a0")], queued)

    asyncio.run(scenario())
    assert recorder.batches == [["a0"], ["b1", "c1", "c2", "a1"], ["a2", "a3"]]


def test_equal_requests_finish_one_after_the_other_not_all_at_the_end():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 1, 0.0)
        queued = [("A", "a1"), ("B", "b1"), ("A", "a2"), ("B", "b2")]
        return await run_while_held(recorder, batcher, [("X", "x0")], queued)

    asyncio.run(scenario())
    # Turn by turn (a1 b1 a2 b2), A's last item would have come third, B's fourth.
    assert recorder.batches == [["x0"], ["a1"], ["a2"], ["b1"], ["b2"]]


def test_a_caller_passed_over_too_often_goes_first():
    recorder = Recorder()

    async def scenario():
        batcher = Batcher(recorder, 1, 0.0, max_passed_over=2)
        singles = [(f"S{index}", f"s{index}") for index in range(1, 5)]
        queued = [("A", "y1"), ("A", "y2"), *singles]
        return await run_while_held(recorder, batcher, [("X", "x0")], queued)

    asyncio.run(scenario())
    # A (two items) waits behind callers of one item, but for two forwards only; then
    # S3 and S4, passed over as often, go before A's second item.
    expected = [["x0"], ["s1"], ["s2"], ["y1"], ["s3"], ["s4"], ["y2"]]
    assert recorder.batches == expected


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


def test_an_error_around_the_model_fails_its_batch_not_the_batcher(caplog):
    """A bug injected where the batch starts (the expediter's hook) and another where the
    model answers one outcome too few: each fails its own batch with an internal error,
    is logged and counted, and the next items are served. Before, the first ended the
    batcher's loop and every later encode waited for ever."""
    starts = 0

    def on_batch_start(items: Sequence[str]) -> None:
        nonlocal starts
        starts += 1
        if starts == 1:
            raise RuntimeError("injected fault in on_batch_start")

    def run_batch(items: Sequence[str]) -> list[str]:
        outcomes = [item.upper() for item in items]
        return outcomes[:-1] if items[0] == "short" else outcomes

    async def scenario():
        batcher = Batcher(run_batch, 4, 0.0, on_batch_start=on_batch_start)
        outcomes = []
        for item in ["first", "short", "later"]:  # one batch each
            try:
                outcomes.append(await batcher.submit(item, item))
            except RuntimeError as error:
                outcomes.append(str(error))
        return outcomes, batcher.stats.num_errors

    outcomes, num_errors = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    internal = "internal error in the encoder's batcher (logged)"
    assert outcomes == [internal, internal, "LATER"]
    assert num_errors == 2
    assert "injected fault in on_batch_start" in caplog.text
    assert "zip() argument 2 is shorter than argument 1" in caplog.text
