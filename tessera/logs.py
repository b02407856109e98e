"""Logging setup shared by every service: `--log-format text|json` (env TESSERA_LOG_FORMAT).

JSON lines carry `ts`, `level`, `logger`, `message`, plus the structured fields a call
passes as `extra={"fields": {...}}` (the access log's request id, tokens, ...), so a log
pipeline can index them without parsing the message. Text lines append the same fields
as `key=value`, so nothing is lost when reading logs by eye.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
from collections.abc import Mapping
from typing import Any

LOG_FORMATS = ("text", "json")
# The attribute `extra={"fields": ...}` sets on a record.
FIELDS_ATTRIBUTE = "fields"
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def record_fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, FIELDS_ATTRIBUTE, None)
    return fields if isinstance(fields, Mapping) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; structured fields become top-level keys (never
    overriding the four fixed ones)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            key: value
            for key, value in record_fields(record).items()
            if key not in ("ts", "level", "logger", "message")
        }
        entry.update(
            ts=datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            level=record.levelname,
            logger=record.name,
            message=record.getMessage(),
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # default=str: a field that is not JSON (a Path, an enum) still logs, as text.
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = record_fields(record)
        if not fields:
            return line
        # The exception (if any) stays last, after the fields of the line it belongs to.
        head, newline, rest = line.partition("\n")
        pairs = " ".join(f"{key}={value}" for key, value in fields.items())
        return f"{head} {pairs}{newline}{rest}"


def formatter_for(log_format: str) -> logging.Formatter:
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    return JsonFormatter() if log_format == "json" else TextFormatter()


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """The root logger at `level`, writing `log_format` lines to stderr. With JSON, what
    would otherwise write raw text to stderr goes through logging or stays quiet: Python
    warnings and transformers' messages become log lines, and its progress bars (weight
    loading) are off, so every line a service writes parses."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter_for(log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(log_format == "json")
    if log_format == "json":
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        # transformers writes its warnings through a handler of its own: ours instead.
        transformers_logging.disable_default_handler()
        transformers_logging.enable_propagation()


def add_log_format_flag(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default,
        help="text lines, or one JSON object per line with structured fields "
        "(env TESSERA_LOG_FORMAT)",
    )
