"""One thread per process for torch work.

torch's CPU build parallelises an op over OpenMP/MKL threads, and that parallelism is
kept per calling thread. Once a second thread of the process has run a parallel op, the
small ops of a decode step lose it for good, in every thread: measured here (2 cores),
eight `[1, 512] x [512, 1536]` matmuls take 0.4 ms on the first thread that runs them and
0.9-1.2 ms on any thread once another has run them; a decode step of the bench model
3.0 ms against 7.0 ms. So each service runs all of its torch work (loading weights,
allocating the KV cache, forwards, sampling, image processing) on this one thread, and
its event loop and helper threads stay off torch.

    compute = compute_thread()
    logits = await compute.run(runner.run, inputs)   # from the event loop
    store = compute.call(allocate_store)             # from synchronous start-up code
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ComputeThread:
    """A single worker thread; calls run one at a time, in order."""

    def __init__(self, name: str = "compute"):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._thread_ids: set[int] = set()

    async def run(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs `function` on the compute thread without blocking the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, functools.partial(self._tracked, function, *args, **kwargs)
        )

    def call(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs `function` on the compute thread and waits (never from the compute
        thread itself, nor from an event loop that must keep serving)."""
        if self.is_current():
            return function(*args, **kwargs)
        return self._executor.submit(self._tracked, function, *args, **kwargs).result()

    def is_current(self) -> bool:
        return threading.get_ident() in self._thread_ids

    def _tracked(self, function: Callable[..., T], *args, **kwargs) -> T:
        self._thread_ids.add(threading.get_ident())
        return function(*args, **kwargs)


@functools.cache
def compute_thread() -> ComputeThread:
    """The process's compute thread (made on first use)."""
    return ComputeThread()


def set_torch_threads(num_threads: int) -> None:
    """--torch-threads: torch's intra-op threads in this process; 0 means one per CPU
    the process may use (affinity mask and cgroup quota: tessera.cpus), where torch
    itself would take every core of the host, a container's limit notwithstanding."""
    if num_threads < 0:
        raise ValueError(f"--torch-threads must be >= 0, got {num_threads}")
    import torch

    from tessera.cpus import usable_cpus

    wanted = num_threads or min(usable_cpus(), torch.get_num_threads())
    if wanted != torch.get_num_threads():
        torch.set_num_threads(wanted)
