"""The engine-speed issue's "must show" figures, computed from runs' results.json.

    python -m benchmarks.must_show docs/benchmarks/runs/*/results.json

prints one markdown table with a column per run, each figure computed by the same
arithmetic from what the run recorded, instead of collated by hand; `make bench` adds
the section for its own run to results.md. A suite a run did not have shows "-".

The 1536 px figure: (TTFT at 1536 px - TTFT at 512 px), medians, over the same
difference for `generate()`. Tessera +167 ms against `generate()` +60 ms -> 2.78x. The
medians come from the growth suite's requests of the two sides taken in alternation
(`large_image` in results.json); runs from before it have only the growth table's rows,
where each side ran in a window of its own. It is judged on the mutual-TLS deployment
where the run has one (the deployment whose gateway sends processed pixels), else on the
plaintext one. Where `generate()`'s own difference is not above zero (its medians at the
two sides within noise of each other, or the wrong way round) there is no ratio: any
overhead of Tessera's is more than 1.5x of none, so +215 ms against -7 ms is missed,
not -29x met.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import markdown_table

Results = dict  # a results.json, as benchmarks.run writes it


@dataclass(frozen=True)
class Target:
    text: str
    meets: Callable[[float], bool]


def at_least(limit: float, unit: str = "x") -> Target:
    return Target(f">= {limit:g}{unit}", lambda value: value >= limit)


def at_most(limit: float, unit: str = "x") -> Target:
    return Target(f"<= {limit:g}{unit}", lambda value: value <= limit)


SHOWN = Target("a table", lambda value: True)  # asked for, not judged


@dataclass(frozen=True)
class Bound:
    """The most any server could reach on the run's host, from the parts' costs measured
    alone the same hour (the run's `ceiling` suite, benchmarks.ceiling): a throughput
    ceiling or a latency floor. A target the bound itself misses is out of reach there."""

    name: str  # "ceiling", "floor"
    value: Callable[[Results], float | None]  # None: the run has no ceiling suite
    unit: str


@dataclass(frozen=True)
class Figure:
    label: str
    target: Target
    value: Callable[[Results], float | None]  # None: the run has no such figure
    text: Callable[[Results, float], str]
    bound: Bound | None = None


def _cell(results: Results, name: str) -> dict | None:
    return next((c for c in results.get("cells", []) if c["name"] == name), None)


def throughput(cell_name: str) -> Callable[[Results], float | None]:
    def value(results: Results) -> float | None:
        cell = _cell(results, cell_name)
        if cell is None or not {"tessera", "hf-generate"} <= set(cell["arms"]):
            return None
        return (
            cell["arms"]["tessera"]["requests_per_s"]
            / cell["arms"]["hf-generate"]["requests_per_s"]
        )

    return value


def _step_ms(results: Results, batch_size: int) -> float | None:
    costs = results.get("step", {}).get("costs", [])
    return next((c["step_ms"] for c in costs if c["batch_size"] == batch_size), None)


def _step_ratio(results: Results) -> float | None:
    four, one = _step_ms(results, 4), _step_ms(results, 1)
    return None if four is None or one is None else four / one


def _step_vs_generate(results: Results) -> float | None:
    one = _step_ms(results, 1)
    return None if one is None else one / results["step"]["generate_ms"]


def _wire(results: Results) -> float | None:
    speeds = results.get("wire", {}).get("mib_per_s", {})
    if "decoder client" not in speeds or "raw TCP" not in speeds:
        return None
    return speeds["decoder client"] / speeds["raw TCP"]


def _ceiling(cell_name: str) -> Bound:
    def value(results: Results) -> float | None:
        return results.get("ceiling", {}).get("ceilings", {}).get(cell_name)

    return Bound("ceiling", value, "x")


def _burst_floor(results: Results) -> float | None:
    floor_ms = results.get("ceiling", {}).get("burst_floor_ms")
    return None if floor_ms is None else floor_ms / 1000


def _ttft_p99_c16(results: Results) -> float | None:
    cell = _cell(results, "reuse80-c16")
    return None if cell is None else cell["arms"]["tessera"]["ttft_p99_ms"] / 1000


def _growth_overheads(results: Results) -> dict[str, float]:
    """Each arm's TTFT at 1536 px minus at 512 px (ms): from the alternating requests
    where the run has them, else from the growth table."""
    rows = results.get("large_image") or [
        row for row in results.get("growth", []) if row["axis"] == "image side (px)"
    ]
    return side_overheads(rows)


def side_overheads(rows: list[dict]) -> dict[str, float]:
    """Each arm's TTFT p50 at 1536 px minus at 512 px (ms), from rows of figures by
    side ({"value": "512", "arms": {arm: {"ttft_p50_ms": ...}}}); {} without both sides."""
    sides = {row["value"]: row["arms"] for row in rows}
    if "512" not in sides or "1536" not in sides:
        return {}
    return {
        arm: sides["1536"][arm]["ttft_p50_ms"] - sides["512"][arm]["ttft_p50_ms"]
        for arm in sides["1536"]
        if arm in sides["512"]
    }


def _judged_arm(overheads: dict[str, float]) -> str:
    return "tessera-mtls" if "tessera-mtls" in overheads else "tessera"


def _overhead_ratio(overhead_ms: float, base_ms: float) -> float:
    """`overhead_ms` over `generate()`'s `base_ms`; without a base above zero, infinite
    for an overhead above zero and 0 for none (module docstring)."""
    if base_ms > 0:
        return overhead_ms / base_ms
    return math.inf if overhead_ms > 0 else 0.0


def _large_image(results: Results) -> float | None:
    overheads = _growth_overheads(results)
    arm = _judged_arm(overheads)
    if arm not in overheads or "hf-generate" not in overheads:
        return None
    return _overhead_ratio(overheads[arm], overheads["hf-generate"])


def _large_image_text(results: Results, ratio: float) -> str:
    overheads = _growth_overheads(results)
    base = overheads["hf-generate"]
    parts = []
    for arm in ("tessera", "tessera-mtls"):
        if arm in overheads:
            times = f"{overheads[arm] / base:.2f}x: " if base > 0 else ""
            parts.append(f"{arm} {times}{overheads[arm]:+.0f} ms")
    none = "" if base > 0 else ": `generate()` measured no overhead"
    return f"{'; '.join(parts)} against {base:+.0f} ms{none}"


def _fetch_waits(results: Results) -> dict[str, float]:
    return {
        cell["name"]: cell["arms"]["tessera"]["fetch_wait_fraction"]
        for cell in results.get("cells", [])
        if cell["arms"].get("tessera", {}).get("fetch_wait_fraction") is not None
    }


def _worst_wait(results: Results) -> float | None:
    waits = _fetch_waits(results)
    return max(waits.values()) if waits else None


def _worst_wait_text(results: Results, worst: float) -> str:
    waits = _fetch_waits(results)
    name = max(waits, key=waits.get)
    return f"{min(waits.values()):.1%}-{worst:.1%} ({name} {worst:.1%})"


def _outputs_equal(results: Results) -> float | None:
    record = next(
        (t for t in results.get("targets", []) if t["figure"].startswith("greedy tokens")), None
    )
    return None if record is None else record["value"]


def _colocated(results: Results) -> float | None:
    """Not judged: the issue asks for the table. The value is the number of cells."""
    return float(len(results.get("disagg", []))) or None


def _colocated_text(results: Results, _: float) -> str:
    parts = []
    for cell in results["disagg"]:
        arms = cell["arms"]
        if {"tessera", "colocated"} <= set(arms):
            ratio = arms["tessera"]["requests_per_s"] / arms["colocated"]["requests_per_s"]
            parts.append(f"{cell['name']}: tessera {ratio:.2f}x of colocated")
    return "; ".join(parts)


def _times(results: Results, value: float) -> str:
    return f"{value:.2f}x"


FIGURES = (
    Figure(
        "throughput vs `generate()`, reuse80-c4",
        at_least(2.0),
        throughput("reuse80-c4"),
        _times,
        _ceiling("reuse80-c4"),
    ),
    Figure(
        "throughput vs `generate()`, reuse0-c4",
        at_least(1.3),
        throughput("reuse0-c4"),
        _times,
        _ceiling("reuse0-c4"),
    ),
    Figure(
        "throughput vs `generate()`, reuse80-c16",
        at_least(3.0),
        throughput("reuse80-c16"),
        _times,
        _ceiling("reuse80-c16"),
    ),
    Figure(
        "outputs equal to `generate()`",
        Target("100%", lambda value: value == 1.0),
        _outputs_equal,
        lambda r, v: f"{v:.0%}",
    ),
    Figure(
        "decode step of 4 / step of 1",
        at_most(1.3),
        _step_ratio,
        lambda r, v: f"{v:.2f}x ({_step_ms(r, 4):.2f} / {_step_ms(r, 1):.2f} ms)",
    ),
    Figure(
        "single-request decode step / `generate()` token",
        at_most(1.0),
        _step_vs_generate,
        lambda r, v: f"{v:.2f}x ({_step_ms(r, 1):.2f} / {r['step']['generate_ms']:.2f} ms)",
    ),
    Figure(
        "slice streaming through the decoder's client / raw TCP",
        at_least(0.6),
        _wire,
        lambda r, v: f"{v:.2f}x (raw TCP {r['wire']['mib_per_s']['raw TCP']:.0f} MiB/s)",
    ),
    Figure(
        "TTFT p99 at 16 clients",
        at_most(1.2, " s"),
        _ttft_p99_c16,
        lambda r, v: f"{v:.2f} s",
        Bound("floor", _burst_floor, " s"),
    ),
    Figure(
        "1536 px TTFT overhead over 512 px, vs `generate()`'s",
        at_most(1.5),
        _large_image,
        _large_image_text,
    ),
    Figure(
        "forward's wait on embeddings, every closed-loop cell",
        Target("<= 5%", lambda value: value <= 0.05),
        _worst_wait,
        _worst_wait_text,
    ),
    Figure(
        "colocated vs disaggregated, both cells",
        SHOWN,
        _colocated,
        _colocated_text,
    ),
)


def column(results: Results) -> list[str]:
    """One run's cell for each figure: its value, the host's bound where the run measured
    it, and whether the value meets the target (and the bound could).

    Example: reuse80-c4 at 1.45x with a ceiling of 2.71x -> "1.45x (this host's ceiling
    2.71x): **missed**"; TTFT p99 2.27 s with a floor of 1.31 s against <= 1.2 s ->
    "2.27 s (this host's floor 1.31 s): **missed**, out of reach on this host".
    """
    cells = []
    for figure in FIGURES:
        value = figure.value(results)
        if value is None:
            cells.append("-")
            continue
        text = figure.text(results, value)
        verdict = "met" if figure.target.meets(value) else "**missed**"
        if figure.target is SHOWN:
            verdict = "shown"
        bound = figure.bound.value(results) if figure.bound else None
        if bound is not None:
            text += f" (this host's {figure.bound.name} {bound:.2f}{figure.bound.unit})"
            if not figure.target.meets(value) and not figure.target.meets(bound):
                verdict += ", out of reach on this host"
        cells.append(f"{text}: {verdict}")
    return cells


def table(runs: list[tuple[str, Results]]) -> str:
    """Figures as rows, runs (named) as columns."""
    columns = [column(results) for _, results in runs]
    rows = [
        [figure.label, figure.target.text, *(c[i] for c in columns)]
        for i, figure in enumerate(FIGURES)
    ]
    return markdown_table(["must show", "target", *(name for name, _ in runs)], rows)


def section(results: dict) -> list[str]:
    """This run's column, as a results.md section (read from what results.json will hold:
    dataclasses and paths as JSON has them)."""
    as_saved = json.loads(json.dumps(results, default=str))
    return [
        "## Engine speed: the issue's must-show figures (`benchmarks.must_show`)\n",
        table([("this run", as_saved)]),
        "",
    ]


def run_name(results: Results, path: Path) -> str:
    return results.get("environment", {}).get("git_commit") or path.parent.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="results.json of each run")
    args = parser.parse_args()
    runs = []
    for path in args.results:
        results = json.loads(path.read_text())
        runs.append((run_name(results, path), results))
    print(table(runs))


if __name__ == "__main__":
    main()
