"""The client and the client commands start without the model stack: `import
tessera.client` and `tessera generate --help` must not import torch or transformers
(checked through sys.modules in a fresh interpreter, never by timing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers")

REPORT = "import json, sys; print(json.dumps(sorted(set(sys.modules) & {heavy!r})))"


def heavy_modules_after(code: str) -> list[str]:
    """Runs `code` in a new interpreter and returns which heavy modules it imported."""
    script = f"{code}\n{REPORT.format(heavy=set(HEAVY))}"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli_code(*argv: str) -> str:
    """Runs the `tessera` entry point with argv, carrying on after its SystemExit."""
    return (
        "from tessera import cli\n"
        "try:\n"
        f"    cli.main({list(argv)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
    )


def test_import_client_is_light():
    assert heavy_modules_after("import tessera.client") == []


@pytest.mark.parametrize("argv", [("generate", "--help"), ("--help",), ("--version",)])
def test_client_commands_are_light(argv):
    assert heavy_modules_after(cli_code(*argv)) == []


def test_the_check_sees_heavy_imports():
    """The check itself can fail: a service command's flags do pull in torch."""
    assert "torch" in heavy_modules_after(cli_code("decoder", "--help"))
