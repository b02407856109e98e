"""The decoder's thread governor: what it reads from /proc/stat, the threads it picks
from what the rest of the host used, and where it turns itself off."""

from __future__ import annotations

import os
import time

import pytest

from tessera.thread_governor import (
    CpuSample,
    ThreadGovernor,
    governor_for_this_process,
    read_host_busy_seconds,
    threads_for,
)

TICK = os.sysconf("SC_CLK_TCK")
# user nice system idle iowait irq softirq steal guest guest_nice
STAT = """cpu  900 900 900 900 900 900 900 900 0 0
cpu0 100 20 30 5000 7000 4 6 8000 0 0
cpu1 200 0 100 9000 0 0 0 0 0 0
cpu2 1000 0 0 0 0 0 0 0 0 0
intr 1 2 3
"""


def test_busy_time_counts_the_named_cpus_and_their_work_fields_only():
    # cpu0: user 100 + nice 20 + system 30 + irq 4 + softirq 6; idle, iowait, steal not.
    assert read_host_busy_seconds({0}, STAT) == pytest.approx(160 / TICK)
    assert read_host_busy_seconds({0, 1}, STAT) == pytest.approx(460 / TICK)
    assert read_host_busy_seconds({5}, STAT) == 0  # the aggregate "cpu" line is never read


def test_busy_time_of_this_host_grows_with_work_done_on_it():
    cpus = os.sched_getaffinity(0)
    before_busy, before_own = read_host_busy_seconds(cpus), time.process_time()
    while time.process_time() - before_own < 0.3:  # CPU time, whatever the wall clock
        pass
    # Our 0.3 s is part of the host's busy time (counted in ticks of 1/TICK s per CPU).
    assert read_host_busy_seconds(cpus) - before_busy >= 0.3 - 2 * len(cpus) / TICK


@pytest.mark.parametrize(
    ("num_cpus", "others", "max_threads", "expected"),
    [
        (2, 0.0, 2, 2),
        (2, 0.3, 2, 2),
        (2, 1.1, 2, 1),
        (2, 2.0, 2, 1),  # never fewer than one
        (8, 2.6, 8, 5),
        (4, 1.5, 4, 3),  # half up, not to the even 2
        (8, 0.0, 4, 4),  # never more than --torch-threads
    ],
)
def test_one_thread_per_cpu_the_others_leave(num_cpus, others, max_threads, expected):
    assert threads_for(num_cpus, others, max_threads) == expected


class FakeHost:
    """Samples a test writes: wall clock, the watched CPUs' busy time, our CPU time."""

    def __init__(self):
        self.now = CpuSample(0.0, 0.0, 0.0)
        self.num_samples = 0

    def advance(self, seconds: float, others_busy: float, own_busy: float) -> None:
        self.now = CpuSample(
            self.now.wall_seconds + seconds,
            self.now.host_busy_seconds + others_busy + own_busy,
            self.now.own_seconds + own_busy,
        )

    def sample(self, cpus) -> CpuSample:
        self.num_samples += 1
        return self.now


def test_governor_follows_the_other_processes_load_window_by_window():
    host, set_to = FakeHost(), []
    clock = lambda: host.now.wall_seconds  # noqa: E731
    governor = ThreadGovernor({0, 1}, 2, set_to.append, host.sample, 0.2, clock)
    # Our own two busy threads are not "others": still two threads.
    host.advance(0.2, others_busy=0.05, own_busy=0.4)
    assert governor.adjust() == 2 and set_to == []
    # An encoder takes a whole CPU: one thread, set once.
    host.advance(0.2, others_busy=0.2, own_busy=0.2)
    assert governor.adjust() == 1 and set_to == [1]
    # Within a window nothing is read and nothing changes, whatever happens.
    samples = host.num_samples
    host.advance(0.1, others_busy=0.0, own_busy=0.1)
    assert governor.adjust() == 1 and host.num_samples == samples
    # The window closes (0.3 s since the last reading, others idle): two threads again.
    host.advance(0.2, others_busy=0.0, own_busy=0.2)
    assert governor.adjust() == 2 and set_to == [1, 2]
    assert governor.num_changes == 2


def test_after_a_restart_a_short_window_decides_and_every_thread_runs_until_it_ends():
    """What the others did while the process had no work (generate()'s turn in the
    benchmark) is not contention for its next forwards; an encoder still computing the
    images it waits for, read in the short window after the restart, is."""
    host, set_to = FakeHost(), []
    clock = lambda: host.now.wall_seconds  # noqa: E731
    governor = ThreadGovernor({0, 1}, 2, set_to.append, host.sample, 0.2, clock)
    host.advance(0.2, others_busy=0.3, own_busy=0.1)  # an encoder beside our forwards
    assert governor.adjust() == 1
    host.advance(1.0, others_busy=1.9, own_busy=0.02)  # no work; the others computed
    governor.restart()
    host.advance(0.02, others_busy=0.0, own_busy=0.0)  # work arrived, the first forward
    assert governor.adjust() == 2 and set_to == [1, 2]
    host.advance(0.04, others_busy=0.05, own_busy=0.08)  # 60 ms: the window ends
    assert governor.adjust() == 1 and set_to == [1, 2, 1]  # an encoder took a CPU
    # Back to windows of 0.2 s.
    samples = host.num_samples
    host.advance(0.1, others_busy=0.0, own_busy=0.2)
    assert governor.adjust() == 1 and host.num_samples == samples
    # A restart read while the encoder computes for 80 ms: one thread at once.
    host.advance(0.5, others_busy=0.0, own_busy=0.0)
    governor.restart()
    host.advance(0.08, others_busy=0.08, own_busy=0.0)
    assert governor.adjust() == 1 and set_to == [1, 2, 1]


def test_while_held_every_forward_runs_on_one_thread_and_letting_go_restarts():
    """An encoder on this host computing the process's items: one thread, whatever the
    window read, until the rows are in; then every thread until a short window decides."""
    host, set_to = FakeHost(), []
    clock = lambda: host.now.wall_seconds  # noqa: E731
    governor = ThreadGovernor({0, 1}, 2, set_to.append, host.sample, 0.2, clock)
    host.advance(0.2, others_busy=0.0, own_busy=0.4)
    assert governor.adjust() == 2
    governor.hold_one_thread(True)
    samples = host.num_samples
    for _ in range(3):  # windows pass with the others idle: still one thread, nothing read
        host.advance(0.3, others_busy=0.0, own_busy=0.3)
        assert governor.adjust() == 1
    assert set_to == [1] and host.num_samples == samples
    governor.hold_one_thread(True)  # said again: nothing changes
    governor.hold_one_thread(False)
    governor.hold_one_thread(False)
    host.advance(0.01, others_busy=0.01, own_busy=0.02)
    assert governor.adjust() == 2 and set_to == [1, 2]  # the restart's every thread
    # The restart's short window (50 ms) decides: the others took a CPU meanwhile.
    host.advance(0.05, others_busy=0.06, own_busy=0.05)
    assert governor.adjust() == 1 and set_to == [1, 2, 1]


def test_governor_is_off_where_it_cannot_see_what_it_shares_or_has_no_choice():
    cpus = {0, 1}
    assert governor_for_this_process(2, cpus, num_usable=1) is None  # quota of 1 CPU
    assert governor_for_this_process(1, cpus, num_usable=2) is None  # one thread anyway
    governor = governor_for_this_process(2, cpus, num_usable=2)
    assert governor is not None and governor.max_threads == 2
