"""Write docs/configuration.md from the `tessera` command's own argparse parsers.

    python scripts/gen_config_reference.py          # rewrite docs/configuration.md
    python scripts/gen_config_reference.py --check  # exit 1 if it drifted from the code

The parsers are the only source: every command, every flag, its default and its help,
read from argparse's actions (whatever flags are added later show up on the next run).
Defaults are rendered with no TESSERA_* variables set, so the page does not depend on
the environment it was generated in.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "configuration.md"

HEADER = """# Configuration reference

Generated from the `tessera` command's parsers by `scripts/gen_config_reference.py`; do
not edit by hand (`python scripts/gen_config_reference.py` rewrites it, `--check` fails
the tests on drift). Defaults are shown as they are without any `TESSERA_*` environment
variable; flags whose help names a variable (env `TESSERA_...`) take their default from
it. `tessera serve` passes any flag it does not know itself to every service that takes
it. Each command's `--help` says the same.
"""


def without_env_defaults() -> None:
    """Defaults read TESSERA_* variables when the parsers are built: drop them first."""
    for name in [n for n in os.environ if n.startswith("TESSERA_")]:
        del os.environ[name]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def default_text(action: argparse.Action) -> str:
    default = action.default
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._StoreFalseAction):
        return "on"
    if default is None or default == argparse.SUPPRESS or default in ([], (), "", {}):
        return ""
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, (list, tuple)):
        return ", ".join(str(item) for item in default)
    return str(default)


def flag_text(action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        names += " (" + " \\| ".join(str(choice) for choice in action.choices) + ")"
    return names


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    try:  # expands %(default)s and friends the way --help does
        return cell(parser._get_formatter()._expand_help(action))
    except (KeyError, TypeError, ValueError):
        return cell(action.help)


def command_section(name: str, parser: argparse.ArgumentParser) -> list[str]:
    lines = [f"## `tessera {name}`", ""]
    if parser.description:
        lines += [cell(parser.description), ""]
    actions = [
        a
        for a in parser._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    lines += ["| flag | default | what it does |", "|---|---|---|"]
    for action in actions:
        default = default_text(action)
        lines.append(
            f"| {flag_text(action)} | {f'`{cell(default)}`' if default else ''} "
            f"| {help_text(parser, action)} |"
        )
    return [*lines, ""]


def render() -> str:
    without_env_defaults()
    sys.path.insert(0, str(ROOT))
    from tessera.cli import build_parser

    commands = subcommands(build_parser(with_services=True))
    lines = [HEADER]
    lines += ["| command | what it does |", "|---|---|"]
    lines += [
        f"| [`tessera {n}`](#tessera-{n}) | {cell(p.description or '')} |"
        for n, p in commands.items()
    ]
    lines.append("")
    for name, parser in commands.items():
        lines += command_section(name, parser)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file drifted")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the file to write or check")
    args = parser.parse_args(argv)
    fresh = render()
    if not args.check:
        args.output.write_text(fresh)
        print(f"wrote {args.output}")
        return 0
    committed = args.output.read_text() if args.output.exists() else ""
    if committed == fresh:
        return 0
    diff = difflib.unified_diff(
        committed.splitlines(), fresh.splitlines(), "committed", "from the parsers", lineterm=""
    )
    print("\n".join(diff))
    print(f"{args.output} is stale: run python scripts/gen_config_reference.py")
    return 1


if __name__ == "__main__":
    sys.exit(main())
