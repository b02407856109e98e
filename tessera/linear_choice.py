"""Which kernel runs each linear shape of the language model, measured on the host at load.

torch's CPU matmul (MKL's sgemm) and oneDNN with a packed weight (tessera.onednn_linear)
rank differently by host and by shape. For a decode step's few rows, on the AMD EPYC
host of docs/benchmarks.md oneDNN was 1.4-2.2x faster on every shape; on an Intel Xeon
host torch was 1.4-2.3x faster on all but the vocabulary-sized lm_head. No fixed choice
serves both, so `--linear-kernel auto` (the decoder's default) times both kernels on
each distinct weight shape, on the thread and with the weights the forwards will use,
and packs only the shapes where oneDNN is clearly faster.

A shape's score is the geometric mean over `ROW_COUNTS` of oneDNN's time over torch's,
so each row count weighs the same whatever its absolute cost:

    512x512 on the Intel host: 1 row 1.62, 4 rows 1.81, 16 rows 0.94, 64 rows 0.98
      -> (1.62 * 1.81 * 0.94 * 0.98) ** (1/4) = 1.29: torch
    8192x512 (lm_head): 1.17, 0.91, 0.72, 0.81 -> 0.89: oneDNN (below 0.95)

Products of hundreds of rows (prefill chunks) were within ~10% of each other on both
hosts and are not timed, which keeps the measurement short: under two seconds for the
bench checkpoint, on the order of ten for a 7B model. Each kernel keeps its fastest of
several alternating rounds (other work only adds time), and the timing waits for the
rest of the host to be quiet (services started together load their models at once), at
most 20 s (a decoder restarted on a busy host should not wait long to serve), after
which every linear stays on torch. Two starts of one decoder may still choose
differently for a shape where the kernels are close; both give the same outputs up to
the last bits, which the exactness rule allows (docs/design.md).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from tessera.linear_kernels import AUTO, LINEAR_KERNELS, ONEDNN, TORCH
from tessera.onednn_linear import (
    OneDnnLinear,
    Shape,
    linear_shape,
    pack_linears,
    packable_linears,
)
from tessera.thread_governor import CpuSample, others_cpus, sample_cpus, watched_cpus

log = logging.getLogger(__name__)

ROW_COUNTS = (1, 4, 16, 64)  # decode steps of 1 to 64 requests, small chunks
# oneDNN is packed only where it is at least this much faster: torch's path is the
# default, and a shape where the two tie is not worth a private op.
MAX_ONEDNN_RATIO = 0.95
MAX_TIMED_LINEARS = 4  # of one shape, called in turn as a forward streams its weights
NUM_ROUNDS = 5  # timed rounds per kernel and row count, alternating
MIN_ROUND_SECONDS = 0.001  # each linear's calls in a round take at least this (timer noise)
MAX_ROW_COUNT_SECONDS = 0.5  # past this, a row count stops after MIN_ROUNDS (large models)
MIN_ROUNDS = 3
# Kernels are timed only while the rest of the host keeps at most this many CPUs busy
# (checked over QUIET_CHECK_SECONDS before, and over the timing itself after). Timings
# taken against other work measured nothing useful on 2 cores: one shape's oneDNN/torch
# ratio came out 0.34 and 2.50 in two decoders started beside fifteen other services.
MAX_OTHERS_CPUS = 0.25
QUIET_CHECK_SECONDS = 0.25  # /proc/stat counts 10 ms ticks: ~0.04 CPU of error per CPU
RETRY_PAUSE_SECONDS = 0.5  # up to twice this, at random: decoders started together
# At most this long waiting for a quiet host; then every linear stays on torch.
MAX_QUIET_WAIT_SECONDS = 20.0


@dataclass(frozen=True)
class ShapeTiming:
    """Both kernels' time per call on one weight shape, by row count."""

    shape: Shape
    num_linears: int  # linears of this shape in the model
    row_counts: tuple[int, ...]
    torch_seconds: tuple[float, ...]  # per call in the fastest round, one per row count
    onednn_seconds: tuple[float, ...]

    @property
    def onednn_ratio(self) -> float:
        """oneDNN's time over torch's, geometric mean over the row counts."""
        ratios = [o / t for o, t in zip(self.onednn_seconds, self.torch_seconds, strict=True)]
        return math.prod(ratios) ** (1 / len(ratios))

    @property
    def kernel(self) -> str:
        return ONEDNN if self.onednn_ratio < MAX_ONEDNN_RATIO else TORCH

    def describe(self) -> str:
        out_features, in_features = self.shape
        return (
            f"{out_features}x{in_features} (x{self.num_linears}): {self.kernel}, "
            f"oneDNN/torch {self.onednn_ratio:.2f}"
        )


def apply_linear_kernel(model: torch.nn.Module, roots: list[torch.nn.Module], kernel: str) -> str:
    """Runs the linears of `roots` (modules of `model`, on a CPU in float32) on `kernel`
    and returns what runs them: "torch", "onednn", or for "auto" the measured choice,
    "auto:torch", "auto:onednn" or "auto:onednn+torch" (some shapes each)."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"linear kernel {kernel!r}: expected one of {', '.join(LINEAR_KERNELS)}")
    if kernel == TORCH:
        return TORCH
    if kernel == ONEDNN:
        pack_linears(model, roots)
        return ONEDNN
    timings, others = time_shapes_on_a_quiet_host(model, roots)
    if timings is None:
        log.warning(
            "linear kernels: the rest of the host stayed busy (%.2f CPUs) for %.0f s: every "
            "linear stays on torch's matmul; --linear-kernel onednn or torch chooses "
            "without timing",
            others,
            MAX_QUIET_WAIT_SECONDS,
        )
        return f"{AUTO}:{TORCH}"
    busy = "" if others is None else f" (the rest of the host used {others:.2f} CPUs meanwhile)"
    log.info("linear kernels by shape%s: %s", busy, "; ".join(t.describe() for t in timings))
    chosen = {t.shape for t in timings if t.kernel == ONEDNN}
    pack_linears(model, roots, shapes=chosen)
    return f"{AUTO}:{_summary(timings)}"


def time_shapes_on_a_quiet_host(
    model: torch.nn.Module,
    roots: list[torch.nn.Module],
    sample: Callable[[], CpuSample] | None = None,
    pause: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[ShapeTiming] | None, float | None]:
    """`time_shapes` once the rest of the host is quiet, and the CPUs it kept busy during
    the timings; (None, CPUs) when it stayed busy for `MAX_QUIET_WAIT_SECONDS`. Services
    started together load their models at once, and a kernel timed against that is
    timed wrong. Where /proc/stat cannot tell (`watched_cpus`), times at once: (timings,
    None). `sample` reads the host's CPU counters (by default over `watched_cpus()`)."""
    if sample is None:
        cpus = watched_cpus()
        if cpus is None or not Path("/proc/stat").exists():
            return time_shapes(model, roots), None
        sample = partial(sample_cpus, cpus)
    deadline = clock() + MAX_QUIET_WAIT_SECONDS
    waited = False
    while True:
        before = sample()
        pause(QUIET_CHECK_SECONDS)
        others = others_cpus(before, sample())
        if others <= MAX_OTHERS_CPUS:
            before = sample()
            timings = time_shapes(model, roots)
            others = others_cpus(before, sample())
            if others <= MAX_OTHERS_CPUS:
                return timings, others
        if clock() >= deadline:
            return None, others
        if not waited:  # said once, not at every look
            waited = True
            log.info(
                "linear kernels: waiting up to %.0f s for a quiet host to time them (the "
                "rest of it keeps %.2f CPUs busy)",
                MAX_QUIET_WAIT_SECONDS,
                others,
            )
        pause(RETRY_PAUSE_SECONDS * random.uniform(1.0, 2.0))


def time_shapes(model: torch.nn.Module, roots: list[torch.nn.Module]) -> list[ShapeTiming]:
    """`time_kernels` for each weight shape among the linears `pack_linears` would pack."""
    by_shape: dict[Shape, list[torch.nn.Linear]] = {}
    for _, _, linear in packable_linears(model, roots):
        group = by_shape.setdefault(linear_shape(linear), [])
        if all(linear is not other for other in group):  # a linear held twice counts once
            group.append(linear)
    return [time_kernels(group) for group in by_shape.values()]


@torch.inference_mode()
def time_kernels(
    linears: Sequence[torch.nn.Linear],
    row_counts: Sequence[int] = ROW_COUNTS,
    num_rounds: int = NUM_ROUNDS,
) -> ShapeTiming:
    """Times torch's and oneDNN's forward on `linears` (one shape). Rounds alternate the
    kernels and each kernel keeps its fastest round: other work on the host only ever
    adds time, so the least disturbed round is the closest to the kernel's own cost.
    Packed copies of at most `MAX_TIMED_LINEARS` of them exist only while timing."""
    timed = list(linears[:MAX_TIMED_LINEARS])
    packed = [OneDnnLinear(linear) for linear in timed]
    weight = timed[0].weight
    generator = torch.Generator(device=weight.device).manual_seed(0)
    torch_seconds, onednn_seconds = [], []
    for num_rows in row_counts:
        rows = torch.randn(
            num_rows, weight.shape[1], generator=generator, dtype=weight.dtype, device=weight.device
        )
        # Warm-up (oneDNN makes its primitive for the shape on the first call), which
        # also sizes a round: enough passes that each linear's calls take at least
        # MIN_ROUND_SECONDS (a round of 4 linears, 4 ms or more).
        passes = max(1, math.ceil(MIN_ROUND_SECONDS / max(_seconds_per_call(timed, rows, 1), 1e-9)))
        _seconds_per_call(packed, rows, passes)
        on_torch, on_onednn = [], []
        started = time.perf_counter()
        for _ in range(num_rounds):
            on_torch.append(_seconds_per_call(timed, rows, passes))
            on_onednn.append(_seconds_per_call(packed, rows, passes))
            spent = time.perf_counter() - started
            if len(on_torch) >= MIN_ROUNDS and spent > MAX_ROW_COUNT_SECONDS:
                break
        torch_seconds.append(min(on_torch))
        onednn_seconds.append(min(on_onednn))
    return ShapeTiming(
        linear_shape(timed[0]),
        len(linears),
        tuple(row_counts),
        tuple(torch_seconds),
        tuple(onednn_seconds),
    )


def _seconds_per_call(modules: Sequence[torch.nn.Module], rows: torch.Tensor, passes: int) -> float:
    """Seconds per call over `passes` passes through `modules`, in turn."""
    started = time.perf_counter()
    for _ in range(passes):
        for module in modules:
            module(rows)
    return (time.perf_counter() - started) / (passes * len(modules))


def _summary(timings: Sequence[ShapeTiming]) -> str:
    kernels = {t.kernel for t in timings} or {TORCH}
    return "+".join(sorted(kernels))
