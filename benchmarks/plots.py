"""PNG plots: throughput vs concurrency, latency CDFs, bytes and encoder passes vs chunk."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from benchmarks.figures import CellResult

STYLE = {
    "hf-generate": ("tab:gray", "s"),
    "reencode-per-chunk": ("tab:red", "v"),
    "whole-fetch": ("tab:orange", "^"),
    "no-cache": ("tab:purple", "D"),
    "tessera": ("tab:blue", "o"),
}


def require_matplotlib() -> None:
    """Fails at once, not after minutes of measuring, when the bench extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            "the benchmarks draw plots with matplotlib: run `make bench`, or install the "
            "bench extra (pip install -e '.[bench]')"
        ) from None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    from matplotlib.ticker import NullFormatter

    for ax in fig.axes:
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    return path


def throughput_vs_concurrency(cells: Sequence[CellResult], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name in cells[0].arms:
        color, marker = STYLE.get(name, ("black", "x"))
        xs = [int(c.concurrency) for c in cells]
        ys = [c.arms[name].requests_per_s for c in cells]
        ax.plot(xs, ys, marker=marker, color=color, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(c.concurrency) for c in cells], [str(c.concurrency) for c in cells])
    ax.set_xlabel("concurrent clients (in-process arms: one request at a time)")
    ax.set_ylabel("requests / s")
    ax.set_title("Throughput, 80% image reuse")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def latency_cdfs(cell: CellResult, path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for name, arm in cell.arms.items():
        color, _ = STYLE.get(name, ("black", "x"))
        for ax, values in zip(axes, (arm.ttft_s, arm.itl_s), strict=True):
            ordered = sorted(v * 1000 for v in values)
            if ordered:
                ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
                ax.step(ordered, ys, where="post", color=color, label=name)
    for ax, label in zip(
        axes, ("time to first token (ms)", "inter-token latency (ms)"), strict=True
    ):
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests" if "first" in label else "fraction of gaps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Latency CDFs: {cell.name} ({cell.concurrency} clients)")
    return _save(fig, path)


def bytes_vs_chunk(cells: Sequence[CellResult], path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = [c.chunk_tokens for c in cells]
    for name in cells[0].arms:
        color, marker = STYLE.get(name, ("black", "x"))
        received = [c.arms[name].bytes_over_minimum for c in cells]
        if all(v is not None for v in received):
            axes[0].plot(xs, received, marker=marker, color=color, label=name)
        passes = [c.arms[name].passes_per_unique_item for c in cells]
        if all(v is not None for v in passes):
            axes[1].plot(xs, passes, marker=marker, color=color, label=name)
    axes[0].set_ylabel("embedding bytes received / minimum")
    axes[1].set_ylabel("encoder passes / unique item")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("prefill chunk (tokens)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Bytes and encoder passes vs chunk size")
    return _save(fig, path)
