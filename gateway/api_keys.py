"""API keys of the gateway's public APIs (HTTP and gRPC): who may call, and as which tenant.

With no keys configured every caller is let in as the one tenant "" (a local or
network-isolated deployment). With keys, a request must carry one (`Authorization:
Bearer <key>`, as OpenAI's clients send it), and the key names its tenant: each key is a
tenant of its own, whose caches are kept apart from every other's (gateway.front's
tenant_salt).
"""

from __future__ import annotations

import argparse
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.config_common import env_default
from tessera.hashing import framed_digest

BEARER = "bearer "


class UnauthenticatedError(PermissionError):
    """A request without a key the gateway knows; the message says what to send."""


@dataclass(frozen=True)
class ApiKeys:
    keys: tuple[str, ...] = ()

    @classmethod
    def of(cls, keys: Iterable[str]) -> ApiKeys:
        unique = tuple(dict.fromkeys(key.strip() for key in keys if key.strip()))
        return cls(unique)

    @property
    def required(self) -> bool:
        return bool(self.keys)

    def tenant_for(self, authorization: str | None) -> str:
        """The tenant of the key in an `Authorization` value ("" when no keys are
        configured); raises UnauthenticatedError for a missing or unknown key. Every
        known key is compared, in constant time, so timing tells nothing of which
        matched or how much of one."""
        if not self.keys:
            return ""
        if not authorization or not authorization.lower().startswith(BEARER):
            raise UnauthenticatedError(
                "this server needs an API key: send the header 'Authorization: Bearer <key>'"
            )
        offered = authorization[len(BEARER) :].strip().encode()
        matched = ""
        for key in self.keys:
            if hmac.compare_digest(offered, key.encode()):
                matched = key
        if not matched:
            raise UnauthenticatedError("the API key is not valid for this server")
        return tenant_id(matched)


def tenant_id(key: str) -> str:
    """A key's tenant id: a digest, so the key itself never travels downstream."""
    return framed_digest([b"tessera-api-key", key.encode()])[:32]


def add_api_key_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="an API key clients must send (Authorization: Bearer KEY); repeat for more "
        "keys, each its own tenant with caches of its own (env TESSERA_API_KEY; prefer "
        "--api-key-file, which keeps keys out of the process list)",
    )
    parser.add_argument(
        "--api-key-file",
        type=Path,
        default=env_default("TESSERA_API_KEY_FILE", None, Path),
        help="a file of API keys, one per line (env TESSERA_API_KEY_FILE)",
    )


def api_keys_from_args(args: argparse.Namespace) -> ApiKeys:
    """Keys from --api-key and TESSERA_API_KEY (--api-key-file is read at start, by
    `with_key_file`, where the file is mounted)."""
    return ApiKeys.of([*args.api_key, env_default("TESSERA_API_KEY", "")])


def with_key_file(keys: ApiKeys, path: Path | None) -> ApiKeys:
    """`keys` plus those of the file at `path` (if any); exits naming the file if it
    cannot be read or holds no key."""
    return keys if path is None else ApiKeys.of([*keys.keys, *_read_key_file(path)])


def _read_key_file(path: Path) -> Sequence[str]:
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise SystemExit(f"--api-key-file {path}: {error.strerror}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not keys:
        raise SystemExit(f"--api-key-file {path} holds no key")
    return keys
