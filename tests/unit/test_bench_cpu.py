"""The benchmarks' CPU accounting: a process's CPU seconds read from /proc, and the
per-request figure the arms table shows."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.figures import ArmFigures, CellResult
from benchmarks.report import arms_table
from benchmarks.services import cpu_seconds

# Spins until it has used `seconds` of CPU (its own clock, not the wall's), says so, and
# stays alive until its stdin closes, so its /proc entry can be read afterwards.
_BURNER = """
import sys, time
while time.process_time() < float(sys.argv[1]):
    pass
print("done", flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_counts_what_a_process_burnt():
    burner = subprocess.Popen(
        [sys.executable, "-c", _BURNER, "0.3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert burner.stdout.readline().strip() == "done"
        used = cpu_seconds(burner.pid)
    finally:
        burner.stdin.close()
        burner.wait()
    # At least what it burnt after starting (the interpreter's start-up adds a little);
    # clock ticks are 10 ms here.
    assert 0.29 <= used < 5.0


def test_cpu_per_request_by_process_in_the_arms_table():
    figures = ArmFigures("tessera", num_requests=4, wall_seconds=2.0)
    figures.add_cpu("decoder", 1.2)
    figures.add_cpu("client", 0.1)
    figures.add_cpu("client", 0.1)
    assert figures.cpu_ms_per_request == pytest.approx({"decoder": 300.0, "client": 50.0})
    assert figures.summary()["cpu_ms_per_request"] == figures.cpu_ms_per_request
    cell = CellResult("cell", "a cell", 4, 128, 0.8, 3, 300.0, {figures.arm: figures})
    assert "decoder 300 / client 50" in arms_table(cell)
