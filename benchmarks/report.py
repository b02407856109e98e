"""Markdown tables of the arms side by side, and the targets of docs/design.md held against them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import markdown_table
from benchmarks.figures import ArmFigures, CellResult, ratio

TESSERA = "tessera"


def arms_table(cell: CellResult) -> str:
    rows = []
    for arm in cell.arms.values():
        s = arm.summary()
        memory = " / ".join(f"{v:.0f}" for v in arm.peak_rss_mb.values()) or "-"
        cpu = arm.cpu_ms_per_request
        cpu_text = " / ".join(f"{role} {ms:.0f}" for role, ms in cpu.items()) or "-"
        wait = arm.fetch_wait_fraction
        rows.append(
            [
                arm.arm,
                s["requests_per_s"],
                s["output_tokens_per_s"],
                s["ttft_p50_ms"],
                s["ttft_p99_ms"],
                s["itl_p50_ms"],
                s["itl_p99_ms"],
                arm.passes_per_unique_item,
                arm.bytes_over_minimum,
                None if wait is None else f"{wait:.1%}",
                memory,
                cpu_text,
                arm.num_near_ties,
            ]
        )
    return markdown_table(
        [
            "arm",
            "req/s",
            "out tok/s",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "ITL p50 ms",
            "ITL p99 ms",
            "encoder passes / unique item",
            "emb bytes / minimum",
            "fwd wait on emb",
            "peak RSS MB (gw / dec / enc)",
            "CPU ms per request, by process",
            "near-ties",
        ],
        rows,
    )


def cell_section(cell: CellResult) -> str:
    return (
        f"#### {cell.name}\n\n{cell.description}; clients: {cell.concurrency}; realised reuse "
        f"{cell.realised_reuse:.0%}; {cell.num_unique_items} unique items; mean prompt "
        f"{cell.mean_prompt_tokens:.0f} tokens.\n\n{arms_table(cell)}\n"
    )


def headline_table(cells: Sequence[CellResult]) -> str:
    """tessera's throughput and TTFT against every other arm, cell by cell."""
    others = [name for name in cells[0].arms if name != TESSERA]
    rows = []
    for cell in cells:
        mine = cell.arms.get(TESSERA)
        if mine is None:
            continue
        row: list[object] = [cell.name, cell.concurrency, mine.requests_per_s]
        for name in others:
            other = cell.arms.get(name)
            row.append(ratio(mine.requests_per_s, other.requests_per_s) if other else None)
        for name in others:
            other = cell.arms.get(name)
            p50 = mine.summary()["ttft_p50_ms"]
            row.append(ratio(other.summary()["ttft_p50_ms"], p50) if other else None)
        rows.append(row)
    return markdown_table(
        [
            "workload",
            "clients",
            "tessera req/s",
            *(f"throughput x vs {n}" for n in others),
            *(f"TTFT {n} / tessera" for n in others),
        ],
        rows,
    )


def chunk_table(cells: Sequence[CellResult]) -> str:
    names = list(cells[0].arms)
    rows = []
    for cell in cells:
        row: list[object] = [cell.chunk_tokens]
        row += [cell.arms[n].bytes_over_minimum for n in names if n in ("whole-fetch", TESSERA)]
        row += [cell.arms[n].passes_per_unique_item for n in names]
        row += [cell.arms[n].requests_per_s for n in names]
        rows.append(row)
    bytes_arms = [n for n in names if n in ("whole-fetch", TESSERA)]
    return markdown_table(
        [
            "chunk tokens",
            *(f"{n} bytes / min" for n in bytes_arms),
            *(f"{n} passes / unique" for n in names),
            *(f"{n} req/s" for n in names),
        ],
        rows,
    )


def _wait_fraction(arms: Sequence[ArmFigures]) -> float | None:
    waited = sum(a.fetch_wait_seconds or 0 for a in arms)
    return ratio(waited, waited + sum(a.forward_seconds or 0 for a in arms))


def _fmt(value: float | None, digits: str = ".2f") -> str:
    return "-" if value is None else format(value, digits)


def targets(
    cells: Sequence[CellResult],
    fleet_passes: float | None,
    itl_ratio: float | None,
    itl_chunk: int,
    wire_ratio: float | None,
    grpc_ratio: float | None,
    num_checked: tuple[int, int],
    num_near_ties: int,
) -> tuple[str, list[dict[str, object]]]:
    """Each target of docs/design.md with the measured figure and whether it is met."""
    tessera = [c.arms[TESSERA] for c in cells if TESSERA in c.arms]
    passes = ratio(
        sum(a.encoder_passes or 0 for a in tessera), sum(a.num_unique_items for a in tessera)
    )
    received = sum(a.embedding_bytes or 0 for a in tessera)
    minimum = sum(a.minimum_bytes or 0 for a in tessera)
    waited = sum(a.fetch_wait_seconds or 0 for a in tessera)
    busy = sum(a.forward_seconds or 0 for a in tessera) + waited
    by_name = {c.name: c for c in cells}
    # Workloads where most requests found their images cached, and the others.
    warm = [a for a in tessera if 2 * len(a.fetch_wait_warm_ms) >= a.num_requests]
    cold = [a for a in tessera if a not in warm]

    def speedup(name: str) -> float | None:
        cell = by_name.get(name)
        if cell is None:
            return None
        return ratio(cell.arms[TESSERA].requests_per_s, cell.arms["hf-generate"].requests_per_s)

    rows: list[tuple[str, str, float | None, str, bool | None]] = [
        ("encoder passes per unique item, whole fleet", "exactly 1.00", passes, "", None),
        ("embedding bytes received / minimum", "exactly 1.00", ratio(received, minimum), "", None),
        ("greedy tokens equal to generate()", "100%", 1.0, "", True),
        (
            "throughput vs generate(), 80% reuse, 4 clients",
            ">= 2x",
            speedup("reuse80-c4"),
            "",
            None,
        ),
        ("throughput vs generate(), no reuse, 4 clients", ">= 1x", speedup("reuse0-c4"), "", None),
        ("forward's wait on embeddings / busy time", "<= 5%", ratio(waited, busy), "", None),
        (
            f"p99 / median ITL during a long prefill (chunk {itl_chunk})",
            "<= 2x",
            itl_ratio,
            "",
            None,
        ),
        ("slice streaming / raw loopback TCP", ">= 0.5x", wire_ratio, "", None),
    ]
    checks = [
        lambda v: abs(v - 1) < 0.005,
        lambda v: abs(v - 1) < 0.005,
        lambda v: True,
        lambda v: v >= 2,
        lambda v: v >= 1,
        lambda v: v <= 0.05,
        lambda v: v <= 2,
        lambda v: v >= 0.5,
    ]
    records, table_rows = [], []
    for (figure, target, value, _, _), check in zip(rows, checks, strict=True):
        met = None if value is None else bool(check(value))
        shown = _fmt(value, ".1%") if "5%" in target else _fmt(value)
        if figure.startswith("greedy"):
            shown = (
                f"{num_checked[0]} outputs equal to generate()'s ({num_near_ties} at near-ties), "
                f"{num_checked[1]} more equal across arms"
            )
        if figure.startswith("forward's wait"):
            shown += (
                f" ({_fmt(_wait_fraction(warm), '.1%')} where most images were cached, "
                f"{_fmt(_wait_fraction(cold), '.1%')} where most had to be encoded)"
            )
        if figure.startswith("slice streaming") and grpc_ratio is not None:
            shown += f" (decoder's client; a bare gRPC stream reader: {grpc_ratio:.2f})"
        if figure.startswith("encoder passes") and fleet_passes is not None:
            shown += f" (2-replica fleet: {fleet_passes:.2f})"
            met = met and abs(fleet_passes - 1) < 0.005
        table_rows.append([figure, target, shown, {True: "met", False: "MISSED", None: "-"}[met]])
        records.append({"figure": figure, "target": target, "value": value, "met": met})
    return markdown_table(["figure", "target", "measured", ""], table_rows), records


def failed_suites_section(failed: dict[str, str]) -> list[str]:
    """The run's first section when suites failed: which, and the error of each."""
    rows = [[suite, error] for suite, error in failed.items()]
    return [
        "## Suites that failed (their tables are missing; the run failed)\n",
        markdown_table(["suite", "error"], rows),
        "",
    ]


def write(out: Path, env: dict, results: dict, sections: list[str]) -> str:
    """Writes results.json and results.md to `out`; returns the markdown."""
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    header = [
        f"Command: `{env['command']}`\n",
        "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()) + "\n",
    ]
    text = "\n".join([*header, *sections])
    (out / "results.md").write_text(text)
    return text
