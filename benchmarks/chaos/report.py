"""docs/reliability.md from the harness's own results (docs/reliability/chaos.json and
soak.json): never typed in."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import markdown_table

HEADERS = [
    "fault",
    "what happens",
    "every role kept",
    "sent",
    "exact",
    "failed",
    "retried",
    "wrong",
    "recovered after (s)",
    "what the client saw",
]


def _row(row: dict) -> list[object]:
    if row["skipped"]:
        return [
            row["fault"],
            row["what"],
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            "-",
            f"skipped: {row['skipped']}",
        ]
    failed = row["num_failed"]
    if failed:
        failed = f"{failed} ({', '.join(f'{k} {v}' for k, v in row['failed_by_status'].items())})"
    return [
        row["fault"],
        row["what"],
        "yes" if row["keeps_every_role"] else "no",
        row["num_sent"],
        row["num_exact"],
        failed,
        row["num_retried"],
        row["num_wrong"],
        row["recovery_seconds"],
        row["client_saw"],
    ]


def _environment_line(environment: dict) -> str:
    return (
        f"commit {environment['git_commit']}{' (dirty)' if environment['git_dirty'] else ''}, "
        f"{environment['started']}, {environment['cpus']} CPUs ({environment['cpu']}), "
        f"{environment['memory_gib']} GiB, torch {environment['torch']}"
    )


def chaos_section(chaos: dict) -> str:
    rows = [_row(row) for row in chaos["rows"]]
    leaks = chaos["leaks"] or ["none"]
    return "\n".join(
        [
            "## Faults under load",
            "",
            f"Produced by `{chaos['command']}` on {_environment_line(chaos['environment'])}.",
            f"Fleet: {chaos['fleet']}; {chaos['network']}. Load: {chaos['rate']} requests/s,",
            "open loop, a fixed mix of text prompts, images from a pool of two (cached) and",
            "images new to the fleet (a cache salt of their own), greedy, 8 new tokens,",
            "16-token prefill chunks; each answer compared with the healthy run's.",
            "",
            "- **exact**: answered with the healthy run's tokens; **wrong**: answered with",
            "  others (must be 0); **failed**: an error status; **retried**: requests the",
            "  client sent again after UNAVAILABLE before any output (the gateway's own retry",
            "  of a decoder that fails before its first token is invisible to the client).",
            "- **recovered after**: from the end of the recovery action (restart, resume,",
            "  heal...) until the first exact answer to a request sent after it.",
            "",
            markdown_table(HEADERS, rows),
            "",
            f"Held after the load (KV blocks, pins, compute leases): {'; '.join(leaks)}.",
            "",
        ]
    )


def soak_section(soak: dict) -> str:
    rows = [
        [
            name,
            f"{p['start_mib']:.0f}",
            f"{p['warm_mib']:.0f}",
            f"{p['end_mib']:.0f}",
            f"{p['growth_mib']:.0f}",
            "yes" if p["within_bound"] else "NO",
        ]
        for name, p in soak["processes"].items()
    ]
    leaks = soak["leaks"] or ["none"]
    figures = soak["figures"]
    return "\n".join(
        [
            "## Soak",
            "",
            f"Produced by `{soak['command']}` on {_environment_line(soak['environment'])}.",
            f"{soak['minutes']:g} minutes of the same mixed load at {soak['rate']} requests/s"
            f" on {soak['network']}: {figures['num_sent']} requests, {figures['num_exact']}"
            f" exact, {figures['num_failed']} failed, {figures['num_wrong']} wrong.",
            f"Bound: after warm-up (the first {soak['warmup_fraction']:.0%} of the run), no "
            f"process's RSS grows by more than {soak['bound']}.",
            "",
            markdown_table(
                ["process", "RSS at start (MiB)", "after warm-up", "at end", "growth", "within"],
                rows,
            ),
            "",
            f"Held at the end (KV blocks, pins, compute leases): {'; '.join(leaks)}.",
            "",
            "![RSS of every process during the soak](reliability/soak_rss.png)",
            "",
        ]
    )


def write(docs: Path) -> Path:
    results = docs / "reliability"
    parts = [
        "# Reliability",
        "",
        "What the fleet does while things break, measured by the harness in",
        "`benchmarks/chaos/` (`make chaos`, `make soak`). Every figure below is written by",
        "it from its own results; rerun to refresh.",
        "",
    ]
    for name, section in (("chaos.json", chaos_section), ("soak.json", soak_section)):
        path = results / name
        if path.exists():
            parts.append(section(json.loads(path.read_text())))
    out = docs / "reliability.md"
    out.write_text("\n".join(parts))
    return out
