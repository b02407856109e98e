"""The committed stubs under tessera/v1/ match proto/, and `--check` notices when not."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "gen_proto.py"), "--check"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_layout(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for part in ["scripts", "proto", "tessera/v1"]:
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_committed_stubs_are_up_to_date():
    result = run_check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_fails_and_names_a_drifted_stub(tmp_path):
    root = copy_layout(tmp_path)
    assert run_check(root).returncode == 0  # the copy itself is faithful
    with (root / "tessera" / "v1" / "common_pb2.py").open("a") as stub:
        stub.write("# hand edit\n")
    result = run_check(root)
    assert result.returncode != 0
    assert "differs: common_pb2.py" in result.stdout


def test_check_fails_on_a_missing_stub(tmp_path):
    root = copy_layout(tmp_path)
    (root / "tessera" / "v1" / "encoder_pb2_grpc.py").unlink()
    result = run_check(root)
    assert result.returncode != 0
    assert "missing: encoder_pb2_grpc.py" in result.stdout


def test_check_fails_on_a_changed_proto(tmp_path):
    root = copy_layout(tmp_path)
    with (root / "proto" / "tessera" / "v1" / "common.proto").open("a") as proto:
        proto.write("\n// Added later.\nmessage Extra {\n  // A field.\n  int32 x = 1;\n}\n")
    result = run_check(root)
    assert result.returncode != 0
    assert "differs: common_pb2.py" in result.stdout
