"""scripts/gpu_check.sh decides between skipping and checking without a GPU to hand:
a stand-in nvidia-smi first on PATH plays the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def run(tmp_path: Path, nvidia_smi_output: str) -> subprocess.CompletedProcess:
    stub = tmp_path / "nvidia-smi"
    stub.write_text(f"#!/bin/sh\nprintf '{nvidia_smi_output}'\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120
    )


def test_a_machine_without_a_gpu_skips_and_says_nothing_was_checked(tmp_path):
    done = run(tmp_path, "")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpu_check: SKIPPED: no NVIDIA GPU on this machine (nvidia-smi lists none)."
    assert lines[-1].startswith("gpu_check: SKIPPED: nothing was checked")
    assert "PASSED" not in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch can use a GPU here")
def test_a_gpu_torch_cannot_use_fails_instead_of_skipping(tmp_path):
    done = run(tmp_path, "GPU 0: Stand-in GPU (UUID: GPU-0)\\n")
    assert done.returncode == 1
    assert "FAILED: this machine has a GPU, but torch cannot use it" in done.stderr
    assert "SKIPPED" not in done.stdout and "PASSED" not in done.stdout
