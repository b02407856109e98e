"""What every benchmark shares: the checkpoint, the environment, progress, tables."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def bench_model(model: str | None, family: str) -> str:
    """The given checkpoint, or a fresh `bench` demo model of `family`."""
    if model:
        return model
    from tessera.demo_models import make_demo_model

    print(f"making the {family} bench demo model")
    directory = Path(tempfile.mkdtemp(prefix="tessera-bench-")) / f"bench-{family}"
    return str(make_demo_model(directory, family=family, seed=0, size="bench"))


def environment(model: str, argv: list[str]) -> dict[str, object]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "command": " ".join(["python -m benchmarks.run", *argv]),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain")),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "machine": platform.machine(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_average_at_start": os.getloadavg(),
        "model": model,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = max(1, total), label, 0
        self.started = time.perf_counter()
        self._draw()

    def advance(self, count: int = 1) -> None:
        self.done += count
        self._draw()
        if self.done >= self.total:
            print(file=sys.stderr, flush=True)

    def _draw(self) -> None:
        filled = 30 * self.done // self.total
        bar = "#" * filled + "." * (30 - filled)
        elapsed = time.perf_counter() - self.started
        print(
            f"\r  {self.label:<30} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s",
            end="",
            file=sys.stderr,
            flush=True,
        )


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
