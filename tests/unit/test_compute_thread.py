"""Every call of a ComputeThread runs on the same one thread, in order, from the event
loop (`run`) and from synchronous code (`call`, also from inside the thread itself)."""

from __future__ import annotations

import asyncio
import threading

from tessera.compute_thread import ComputeThread, compute_thread


def test_run_and_call_use_one_thread_in_order():
    compute = ComputeThread()
    seen: list[tuple[int, int]] = []

    def record(index: int) -> int:
        seen.append((index, threading.get_ident()))
        return index * 10

    async def from_the_loop() -> list[int]:
        return list(await asyncio.gather(*(compute.run(record, i) for i in range(5))))

    assert asyncio.run(from_the_loop()) == [0, 10, 20, 30, 40]
    assert compute.call(record, 5) == 50
    assert compute.call(compute.call, record, 6) == 60  # re-entrant: no deadlock
    assert [index for index, _ in seen] == list(range(7))
    (thread,) = {ident for _, ident in seen}
    assert thread != threading.get_ident()
    assert not compute.is_current()


def test_the_process_has_one():
    assert compute_thread() is compute_thread()
