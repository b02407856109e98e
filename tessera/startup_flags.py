"""Parsing helpers for the flags a vLLM user expects (`--dtype auto`, `--limit-mm-per-prompt`
in vLLM's forms, `--chat-template`, ...), shared by every service's parser.

Light on purpose: no torch, no transformers, so `tessera serve` can check every flag of
every service before any process starts (tessera.preflight).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

# --dtype: vLLM's names; the aliases are vLLM's too.
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"float": "float32", "half": "float16"}
HALF_DTYPES = frozenset({"bfloat16", "float16"})

# Media kinds --limit-mm-per-prompt may name (tessera.placeholders.Modality values).
MODALITIES = ("image", "audio")
DEFAULT_ITEMS_PER_MODALITY = 16

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Flags whose default may be a secret (read from the environment): --help never prints it.
SECRET_DESTS = frozenset({"api_key", "redis_password"})


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends with its default, as vLLM's does; not when the help already
    says what the default is, and never for a flag that may hold a secret."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if not self._shows_default(action) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and self._shows_default(action):
            action = copy.copy(action)  # a flag with no help still says its default
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    @staticmethod
    def _shows_default(action: argparse.Action) -> bool:
        return (
            bool(action.option_strings)
            and action.dest not in SECRET_DESTS
            and action.default not in (None, argparse.SUPPRESS)
        )


def dtype_flag(value: str) -> str:
    """`--dtype`: auto, float32 (float), bfloat16, float16 (half)."""
    name = _DTYPE_ALIASES.get(value.lower(), value.lower())
    if name not in DTYPE_CHOICES:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a dtype; choose one of {', '.join(DTYPE_CHOICES)} (or float, half)"
        )
    return name


def resolve_dtype(flag: str, checkpoint_dtype: str | None, device: str) -> str:
    """The dtype weights load in, by name. `auto`: the checkpoint's own dtype (its
    config.json), except that on a CPU a half-precision checkpoint runs in float32, and a
    checkpoint that names none runs in float32 (docs/startup-flags.md says how and why
    this differs from vLLM).

    resolve_dtype("auto", "bfloat16", "cuda:0") == "bfloat16"
    resolve_dtype("auto", "bfloat16", "cpu") == "float32"
    """
    if flag != "auto":
        return flag
    name = _DTYPE_ALIASES.get(checkpoint_dtype or "", checkpoint_dtype or "float32")
    if name not in DTYPE_CHOICES:  # e.g. float8 checkpoints: not something we run
        return "float32"
    if name in HALF_DTYPES and device.split(":", 1)[0] == "cpu":
        return "float32"
    return name


@dataclass(frozen=True)
class MediaCountLimits:
    """Most items of each modality one prompt may hold (--limit-mm-per-prompt); a
    modality not named gets `default`. 0 refuses the modality altogether."""

    per_modality: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    default: int = DEFAULT_ITEMS_PER_MODALITY

    def limit(self, modality: str) -> int:
        return self.per_modality.get(modality, self.default)

    def describe(self) -> str:
        """`image=4,audio=1` (and `*=16` for the modalities not named)."""
        named = [f"{name}={count}" for name, count in self.per_modality.items()]
        return ",".join([*named, f"*={self.default}"])

    @classmethod
    def of(cls, value: MediaCountLimits | int) -> MediaCountLimits:
        return value if isinstance(value, MediaCountLimits) else cls(default=int(value))


def limit_mm_per_prompt(value: str) -> MediaCountLimits:
    """`--limit-mm-per-prompt` in each of vLLM's forms:

    '{"image": 4, "audio": 1}' (JSON)  ->  image 4, audio 1, others the default
    'image=4,audio=1'                  ->  the same
    '4'                                ->  4 of every modality
    """
    text = value.strip()
    if text.isdigit():
        return MediaCountLimits(default=int(text))
    if text.startswith("{"):
        try:
            pairs = json.loads(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
        if not isinstance(pairs, dict):
            raise argparse.ArgumentTypeError('expected a JSON object such as {"image": 4}')
    else:
        pairs = dict(_key_value(part) for part in text.split(",") if part.strip())
    if not pairs:
        raise argparse.ArgumentTypeError("give image=N[,audio=M], a JSON object or a number")
    return MediaCountLimits(MappingProxyType({k: _count(k, v) for k, v in pairs.items()}))


def _key_value(part: str) -> tuple[str, str]:
    key, sep, count = part.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{part.strip()!r} is not MODALITY=N (e.g. image=4)")
    return key.strip(), count.strip()


def _count(modality: str, count: object) -> int:
    if modality not in MODALITIES:
        raise argparse.ArgumentTypeError(
            f"unknown modality {modality!r}; tessera takes {', '.join(MODALITIES)}"
        )
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise argparse.ArgumentTypeError(
            f"{modality}: the limit must be a whole number >= 0, got {count!r}"
        )
    return count


def port_number(value: str) -> int:
    """A TCP port, 0..65535 (0: any free port, or off, as the flag says)."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {port}")
    return port


def log_level(value: str) -> str:
    """`--log-level` in any case: debug, INFO, ..."""
    name = value.upper()
    if name not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a log level; choose one of {', '.join(LOG_LEVELS).lower()}"
        )
    return name


def is_debug(level: str | None) -> bool:
    return (level or "").upper() == "DEBUG"


def load_chat_template(value: str) -> str:
    """`--chat-template`, as vLLM takes it: a file's path, or the Jinja template itself
    (anything with braces or a line break is taken as the template). Raises ValueError
    naming what is wrong: an unreadable file, or a template Jinja cannot parse."""
    path = Path(value).expanduser()
    if any(char in value for char in "{}\n"):
        template = value
    elif path.is_file():
        try:
            template = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"cannot read {value}: {error}") from None
    else:
        raise ValueError(f"{value} is neither a file nor a Jinja template")
    from jinja2 import Environment, TemplateSyntaxError

    try:
        Environment().parse(template)
    except TemplateSyntaxError as error:
        raise ValueError(f"the template does not parse: {error} (line {error.lineno})") from None
    return template


def chat_template_flag(value: str) -> str:
    """argparse type of --chat-template: the flag's value, checked (the gateway reads the
    file again at start, where it is mounted)."""
    try:
        load_chat_template(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value
