"""Regenerate the committed protobuf/gRPC stubs under tessera/v1/ from proto/.

    python scripts/gen_proto.py          # rewrite the stubs
    python scripts/gen_proto.py --check  # exit 1 if the committed stubs drifted

Generated imports are absolute (`from tessera.v1 import common_pb2`) because the proto
root is `proto/` and the package path is `tessera/v1`.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("tessera") / "v1"


def generate(out_dir: Path) -> list[Path]:
    """Runs protoc over every .proto file, writing stubs below `out_dir`."""
    protos = sorted((PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    grpc_include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{grpc_include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / PACKAGE_DIR).glob("*_pb2*.py*"))


def generated_names(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*_pb2*.py*")}


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        fresh_dir = Path(tmp) / PACKAGE_DIR
        generate(Path(tmp))
        committed_dir = ROOT / PACKAGE_DIR
        fresh, committed = generated_names(fresh_dir), generated_names(committed_dir)
        problems = [f"missing: {n}" for n in sorted(fresh - committed)]
        problems += [f"stale: {n}" for n in sorted(committed - fresh)]
        problems += [
            f"differs: {n}"
            for n in sorted(fresh & committed)
            if not filecmp.cmp(fresh_dir / n, committed_dir / n, shallow=False)
        ]
    if problems:
        print("generated stubs drifted from proto/ (run scripts/gen_proto.py):")
        print("\n".join(f"  {p}" for p in problems))
        return 1
    print(f"stubs up to date ({len(fresh)} files)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed stubs differ")
    if parser.parse_args().check:
        return check()
    written = generate(ROOT)
    print(f"wrote {len(written)} files under {ROOT / PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
