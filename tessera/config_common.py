"""Flags every service shares. Environment variables only provide defaults, read when the
parser is built (never at import time)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def env_default(name: str, default: T, parse: Callable[[str], T] = str) -> T:  # type: ignore[assignment]
    """`parse(os.environ[name])` if set, else `default`."""
    raw = os.environ.get(name)
    return default if raw is None or raw == "" else parse(raw)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=env_default("TESSERA_MODEL", None),
        required=env_default("TESSERA_MODEL", None) is None,
        help="checkpoint directory or hub id (env TESSERA_MODEL)",
    )
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="weights and activations dtype",
    )
    parser.add_argument(
        "--model-fingerprint",
        default=None,
        help="override the fingerprint computed from the checkpoint's files "
        "(must be the same on the gateway and every encoder)",
    )


def add_common_flags(parser: argparse.ArgumentParser, default_port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=default_port, help="gRPC port (0 = any free)")
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=10.0,
        help="on SIGTERM, how long in-flight requests get to finish",
    )
    parser.add_argument("--log-level", default=env_default("TESSERA_LOG_LEVEL", "INFO"))
