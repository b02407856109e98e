"""Every CPU for the encode a decoder waits on with nothing else to run.

Where the encoder shares a host with a decoder (`tessera serve`, the benchmarks'
deployments) it runs on half the CPUs (`tessera.cpus.shared_host_torch_threads`): with
more, a busy decoder's forwards wait at barriers for threads the encoder preempts. But
while the decoder has nothing to run until an item's rows arrive, the CPUs left to it
idle: an image of the bench checkpoint takes 95 ms through the tower on one thread and
55 ms on two, the same rows (docs/benchmarks.md). Only the decoder knows when it idles,
so it says so (`Expedite`, naming the items it waits on) and says so again when it has
work (an empty call). While some decoder idles for an item of the batch computing, the
batch runs on `--expedite-torch-threads`; the threads switch before each of the tower's
modules, so either call counts from the next module on. A batch holding such an item
does not wait to fill.

    decoder idles for A and B (a burst's first images)  -> A computes on 2 threads
    A's rows land, the decoder prefills A: "no longer"  -> A's last layers, or B, on 1
    the decoder idles again, for B                      -> B's next layers on 2

Ending the wide threads when the decoder's work starts, not when the item's encode
ends, is what keeps this from costing a busy decoder: wide threads kept to the end of
the batch cost a cell of 4 clients and 80% cached images 6-10% of its throughput (the
decoder prefilled a cached item's prompt while the encoder ran wide beside it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Iterable, Sequence

import torch

from tessera.cpus import usable_cpus

MAX_DECODERS = 64  # decoders whose last call is remembered


class TowerThreads:
    """The compute thread's torch threads: `wide` while the running batch is expedited,
    else `narrow`. `expedited` is written on the event loop and read on the compute
    thread (a bool: one load under the GIL); the threads change only on the compute
    thread, where torch keeps them (tessera.compute_thread)."""

    def __init__(
        self,
        narrow: int,
        wide: int,
        set_threads: Callable[[int], None] = torch.set_num_threads,
    ):
        self.narrow = narrow
        self.wide = max(wide, narrow)
        self.expedited = False
        self._set_threads = set_threads
        self._current = narrow

    @classmethod
    def unchanged(cls) -> TowerThreads:
        """Never changes the threads (no call to `set_threads`)."""
        return cls(0, 0)

    @property
    def can_widen(self) -> bool:
        return self.wide > self.narrow

    def attach(self, modules: Iterable[torch.nn.Module]) -> None:
        """Checks `expedited` before every submodule of `modules` runs (a few hundred
        checks per image, each a comparison unless the threads change)."""
        if not self.can_widen:
            return
        for module in modules:
            for submodule in module.modules():
                submodule.register_forward_pre_hook(self._before_module)

    def run(self, function: Callable[..., list], *args) -> list:
        """On the compute thread: `function(*args)` (a batch), then the narrow threads."""
        self.apply()
        try:
            return function(*args)
        finally:
            self._switch(self.narrow)

    def apply(self) -> None:
        self._switch(self.wide if self.expedited else self.narrow)

    def _before_module(self, module: torch.nn.Module, args: tuple) -> None:
        self.apply()

    def _switch(self, num_threads: int) -> None:
        if num_threads != self._current:
            self._set_threads(num_threads)
            self._current = num_threads


def tower_threads(modules: Iterable[torch.nn.Module], expedite_threads: int) -> TowerThreads:
    """On the compute thread: its threads now as the narrow ones, --expedite-torch-threads
    (0: one per CPU the process may use) as the wide ones, checked before each of
    `modules`' submodules."""
    if expedite_threads < 0:
        raise ValueError(f"--expedite-torch-threads must be >= 0, got {expedite_threads}")
    threads = TowerThreads(torch.get_num_threads(), expedite_threads or usable_cpus())
    threads.attach(modules)
    return threads


class IdleDecoders:
    """What each decoder last said it idles for, at most `max_decoders` of them (the
    longest silent forgotten first)."""

    def __init__(self, max_decoders: int = MAX_DECODERS):
        self.max_decoders = max_decoders
        self._said: OrderedDict[str, tuple[int, frozenset[str]]] = OrderedDict()

    def __len__(self) -> int:
        return sum(1 for _, content_hashes in self._said.values() if content_hashes)

    def say(self, decoder_id: str, sequence: int, content_hashes: frozenset[str]) -> bool:
        """False (and nothing changes) for a call older than the last heard from it."""
        last = self._said.get(decoder_id)
        if last is not None and sequence <= last[0]:
            return False
        self._said[decoder_id] = (sequence, content_hashes)
        self._said.move_to_end(decoder_id)
        while len(self._said) > self.max_decoders:
            self._said.popitem(last=False)
        return True

    def wanted(self, content_hashes: Collection[str]) -> bool:
        return any(not said.isdisjoint(content_hashes) for _, said in self._said.values())

    def forget_done(self, in_flight: Container[str]) -> None:
        """Items no longer in flight here (computed, found elsewhere, cancelled) are
        forgotten: a decoder that stopped calling leaves nothing behind."""
        for decoder_id, (sequence, said) in self._said.items():
            self._said[decoder_id] = (sequence, frozenset(h for h in said if h in in_flight))


class Expediter:
    """The encoder's side of Expedite, driven from the event loop: what decoders say in;
    the threads of the batch running and the batcher's wait to fill out."""

    def __init__(self, threads: TowerThreads, hurry: Callable[[], None]):
        self.threads = threads
        self.decoders = IdleDecoders()
        self._hurry = hurry
        self._running: frozenset[str] = frozenset()
        self._running_expedited = False

    def hear(
        self,
        decoder_id: str,
        sequence: int,
        content_hashes: frozenset[str],
        in_flight: Container[str],
    ) -> bool:
        """A decoder idles for `content_hashes` (all in flight here; none: it no longer
        idles). False for a call older than one already heard from the decoder."""
        if not self.decoders.say(decoder_id, sequence, content_hashes):
            return False
        self.decoders.forget_done(in_flight)
        self._update_running()
        if not content_hashes <= self._running:  # queued, or on their way to the queue
            self._hurry()
        return True

    def batch_started(self, content_hashes: Sequence[str]) -> None:
        self._running = frozenset(content_hashes)
        self._running_expedited = False
        self._update_running()

    def batch_ended(self) -> bool:
        """Whether the batch that ended ran expedited (for some of it, at least)."""
        expedited = self._running_expedited
        self.threads.expedited = False
        self._running, self._running_expedited = frozenset(), False
        return expedited

    def _update_running(self) -> None:
        wanted = self.decoders.wanted(self._running)
        self.threads.expedited = wanted
        self._running_expedited |= wanted
