"""Fewer torch threads while the rest of the host keeps its CPUs busy.

A torch op on a CPU splits its work over the calling thread's intra-op threads and waits
at a barrier for the last of them. When another process keeps a CPU busy (an encoder
computing beside a decoder, as `tessera serve` and the benchmarks run them on one host),
one of those threads is preempted and every op waits for it, spinning. Measured on 2
cores (docs/benchmarks.md, "Sizing the decoder's threads step by step"): during a burst
of new images a two-thread decoder used 6.6 CPU-seconds for forwards it ran in 3.5 on one
thread, and finished the burst later.

The governor looks at how much CPU the rest of the host used over the last window and
gives the compute thread one intra-op thread per CPU left, at least one:

    2 CPUs, the others used 1.1 of them over the last 0.2 s -> 2 - 1.1 = 0.9: 1 thread
    2 CPUs, the others used 0.3                             -> 1.7: 2 threads

A process that had no work at all and gets some calls `restart`: what the others did
while it had nothing to do (`generate()`'s turn in the benchmarks, another tenant's
burst) says nothing about what they will take from its next forwards. The window
starts again, shorter (50 ms), with every thread until it ends; a window that ends
while the others still compute (an encoder working on the images this decoder waits
for) gives the threads back to them as before:

    idle 1 s while the others used 1.9 CPUs, restart, first forward 20 ms later -> 2 threads
    restart, the encoder computes for 80 ms, then the first forward             -> 1 thread

The decoder restarts it again when the rows it waited for have arrived and no item it
waits for is still being encoded (`decoder_service.engine`): the encoder's 80 ms above
were spent on those rows, and without the restart the prefill that uses them ran on one
thread until the window ended.

What no window can foresee is another process starting to compute in the middle of a
forward: the forward running then pays at every barrier. Where the process knows such
work is under way on its host, it says so with `hold_one_thread`: the decoder while an
encoder on its host computes items it fetches (`decoder_service.engine`). Measured on 2
cores (docs/benchmarks.md): decode steps of three streams took 87-128 ms on two threads
as such an encoder's rows landed and its next image started, against 10-11 ms on one.
The hold ends with a `restart`: what the encoder used says nothing about what comes next.

    forwards on 2 threads; a request's image starts encoding on this host
    hold_one_thread(True)  -> 1 thread, nothing read
    its rows have all arrived
    hold_one_thread(False) -> restart: 2 threads until the short window decides

It reads /proc/stat over the CPUs of the process's affinity mask, so it runs only where
those CPUs are all the process may use (a host, or a container pinned to CPUs); under a
cgroup quota tighter than the mask the other tenants' time says nothing about ours, and
it stays off. Call `adjust` on the thread that runs the model, before each forward:
torch keeps the thread count per calling thread. Changing it does not change results
(the same matmul and attention on one or two threads are bit-identical here: tested).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from tessera.cpus import usable_cpus

log = logging.getLogger(__name__)

WINDOW_SECONDS = 0.2  # /proc/stat counts in 10 ms ticks: ~0.1 CPU of error per CPU here
# The first window after `restart`: short, so that a decoder waiting for an encoder's
# images learns of it by its first forward (with ~0.2 CPU of error per CPU).
RESTART_WINDOW_SECONDS = 0.05
# /proc/stat's per-CPU fields that count work: user, nice, system, irq, softirq (not
# idle, iowait, or steal, which is time the hypervisor gave to someone else).
_BUSY_FIELDS = (0, 1, 2, 5, 6)


@dataclass(frozen=True)
class CpuSample:
    wall_seconds: float
    host_busy_seconds: float  # summed over the watched CPUs
    own_seconds: float  # this process's CPU time, every thread


def read_host_busy_seconds(cpus: Collection[int], stat_text: str | None = None) -> float:
    """Busy time of `cpus` since boot, from /proc/stat ("cpu3 120 0 40 ..." lines)."""
    text = Path("/proc/stat").read_text() if stat_text is None else stat_text
    ticks = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        ticks += sum(int(fields[i]) for i in _BUSY_FIELDS)
    return ticks / os.sysconf("SC_CLK_TCK")


def sample_cpus(cpus: Collection[int]) -> CpuSample:
    times = os.times()
    return CpuSample(time.monotonic(), read_host_busy_seconds(cpus), times.user + times.system)


def others_cpus(before: CpuSample, after: CpuSample) -> float:
    """CPUs the rest of the host kept busy on average between two samples (at least 0:
    the counters tick at different times)."""
    elapsed = after.wall_seconds - before.wall_seconds
    others = after.host_busy_seconds - before.host_busy_seconds
    others -= after.own_seconds - before.own_seconds
    return max(0.0, others) / elapsed


def watched_cpus(
    cpus: Collection[int] | None = None, num_usable: int | None = None
) -> frozenset[int] | None:
    """The CPUs (this process's affinity mask, unless `cpus`) on which /proc/stat tells
    what the rest of the host does, or None where it cannot: a cgroup quota leaving fewer
    CPUs (`num_usable`, by default `usable_cpus()`) than the mask holds, whose other
    tenants' time says nothing about ours."""
    if cpus is None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        cpus = os.sched_getaffinity(0)
    if (usable_cpus() if num_usable is None else num_usable) < len(cpus):
        return None
    return frozenset(cpus)


def threads_for(num_cpus: int, num_others_busy: float, max_threads: int) -> int:
    """One thread per CPU the others leave (`num_others_busy`: CPUs they kept busy, from
    `others_cpus`), rounded half up, within `[1, max_threads]`."""
    return max(1, min(max_threads, math.floor(num_cpus - num_others_busy + 0.5)))


class ThreadGovernor:
    """Sizes the calling thread's torch intra-op pool to the CPUs the host leaves it."""

    def __init__(
        self,
        cpus: Collection[int],
        max_threads: int,
        set_threads: Callable[[int], None],
        sample: Callable[[Collection[int]], CpuSample] = sample_cpus,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.cpus = frozenset(cpus)
        self.max_threads = max_threads
        self.threads = max_threads
        self.num_changes = 0
        self._set_threads = set_threads
        self._sample = sample
        self._window_seconds = window_seconds
        self._clock = clock
        self._last = sample(self.cpus)
        self._window = window_seconds  # of the window running now
        self._restarted = False
        self._held = False

    def restart(self) -> None:
        """The process had no work and now has some: a new, short window, every thread
        until it ends. Any thread may call it while no forward runs."""
        self._last = self._sample(self.cpus)
        self._window = min(RESTART_WINDOW_SECONDS, self._window_seconds)
        self._restarted = True

    def hold_one_thread(self, hold: bool) -> None:
        """While `hold`, every forward runs on one thread (another process on this host
        computes for this one, see the module's docstring); letting go restarts the
        window. Call it while no forward runs; calls that change nothing cost nothing."""
        if hold == self._held:
            return
        self._held = hold
        if not hold:
            self.restart()

    def adjust(self) -> int:
        """The thread count for the next forward (re-decided once a window has passed)."""
        if self._held:
            self._use(1)
            return 1
        if self._clock() - self._last.wall_seconds < self._window:
            if self._restarted:  # nothing read since the restart: every thread
                self._restarted = False
                self._use(self.max_threads)
            return self.threads  # most steps: no system call
        now = self._sample(self.cpus)
        others = others_cpus(self._last, now)
        self._last = now
        self._window, self._restarted = self._window_seconds, False
        self._use(threads_for(len(self.cpus), others, self.max_threads))
        return self.threads

    def _use(self, threads: int) -> None:
        if threads != self.threads:
            self._set_threads(threads)
            self.threads = threads
            self.num_changes += 1


def governor_for_this_process(
    max_threads: int, cpus: Collection[int] | None = None, num_usable: int | None = None
) -> ThreadGovernor | None:
    """A governor over this process's CPUs (its affinity mask, unless `cpus`), or None
    where it has nothing to decide (one thread) or cannot see what it shares: a cgroup
    quota leaving fewer CPUs (`num_usable`, by default `usable_cpus()`) than the mask
    holds, or no /proc/stat."""
    import torch

    if max_threads <= 1:
        return None
    cpus = watched_cpus(cpus, num_usable)
    if cpus is None:
        log.info("adaptive torch threads off: no affinity mask, or a CPU quota tighter than it")
        return None
    try:
        return ThreadGovernor(cpus, max_threads, torch.set_num_threads)
    except OSError as error:
        log.info("adaptive torch threads off: %s", error)
        return None
