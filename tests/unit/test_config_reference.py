"""docs/configuration.md is in step with the parsers, and the check notices drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gen_config_reference.py"
REFERENCE = ROOT / "docs" / "configuration.md"


def check(output: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_reference_is_in_step_with_the_parsers():
    done = check(REFERENCE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_drift_is_reported(tmp_path):
    """A flag missing from the page (as when someone adds one) fails the check."""
    lines = REFERENCE.read_text().splitlines(keepends=True)
    stale = tmp_path / "configuration.md"
    stale.write_text("".join(line for line in lines if "`--kv-cache-bytes`" not in line))
    done = check(stale)
    assert done.returncode == 1
    assert "--kv-cache-bytes" in done.stdout and "is stale" in done.stdout


def test_every_command_and_some_known_flags_are_listed():
    text = REFERENCE.read_text()
    for command in ("encoder", "decoder", "gateway", "serve", "generate", "make-demo-model"):
        assert f"## `tessera {command}`" in text
    for flag in ("`--kv-cache-memory-fraction`", "`--redis-url`", "`--http-port`", "`--seed`"):
        assert flag in text
