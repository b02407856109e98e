"""Whose content hashes the encoder takes as given, and whose it checks.

A content hash names an item's decoded content (tessera.hashing). The gateway decodes
and hashes every item anyway (to route it and to count its rows); an encoder that
checked each hash again would hash the same pixels a second time. So:

- With mutual TLS, a caller whose certificate name is in `--trust-content-hashes-from`
  (default: `gateway`) and whose Encode names this encoder's model fingerprint has its
  hashes taken as given. The encoder still decodes the item (its tower needs the
  pixels), but does not hash them.
- Every other caller's hashes are checked against the decoded content: other roles, a
  caller that names no fingerprint, and every caller of an encoder without mutual TLS,
  where no caller has a verified name (a caller the encoder has not authenticated is
  treated as hostile).
- An Encode that names another model's fingerprint is refused whoever sends it: the
  caller serves another model, and trusting its hashes would file this model's rows
  under the other model's names. (Before trust, the hash check caught that.)

Checking cannot be made cheap by hashing the encoded bytes instead: the name is over
decoded pixels (so a PNG and a lossless WebP of one picture share an entry), and a hash
of the file says nothing about whether the pixel hash is the right name for it.

The risk taken (docs/security.md): a trusted but compromised gateway can file rows of
one picture under the name of another, and every request for that name, through any
gateway, gets them until the entry leaves the caches (memory eviction, the Redis TTL).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tessera.access import ANY_CALLER

# A string, so that argparse parses it like a flag value (and --help shows it so).
DEFAULT_TRUSTED_CALLERS = "gateway"


@dataclass(frozen=True)
class HashTrust:
    """The caller names (certificate common names) whose hashes are taken as given."""

    callers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, names: frozenset[str], mutual_tls: bool) -> HashTrust:
        """Without mutual TLS no caller has a verified name, so nobody is trusted."""
        return cls(names if mutual_tls else frozenset())

    def trusts(self, caller: str, named_fingerprint: str, own_fingerprint: str) -> bool:
        """Whether `caller`'s hashes go unchecked. Raises ValueError for an Encode made
        for another model (`named_fingerprint` set and not `own_fingerprint`)."""
        if named_fingerprint and named_fingerprint != own_fingerprint:
            # Not this encoder's fingerprint in the message: it stays unsaid to callers.
            raise ValueError(
                f"the request's content hashes are made for model fingerprint "
                f"{named_fingerprint}, and this encoder serves another model; do the gateway "
                "and encoder serve the same model?"
            )
        # "" is no name: a caller without a verified certificate.
        return bool(caller and named_fingerprint) and caller in self.callers

    def describe(self) -> str:
        """For the start line: who is trusted, or that every hash is checked."""
        return ",".join(sorted(self.callers)) or "none (every hash checked)"


def trusted_caller_names(value: str) -> frozenset[str]:
    """`"gateway, decoder"` -> `frozenset({"gateway", "decoder"})`; `""` -> nobody."""
    names = frozenset(name.strip() for name in value.split(",") if name.strip())
    if ANY_CALLER in names:
        raise argparse.ArgumentTypeError(
            f"{ANY_CALLER!r} would trust every certificate of the CA with content hashes; "
            "name the roles (e.g. gateway)"
        )
    return names


def add_trust_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trust-content-hashes-from",
        type=trusted_caller_names,
        default=DEFAULT_TRUSTED_CALLERS,
        metavar="NAME[,NAME...]",
        help="with mutual TLS, the client-certificate common names whose content hashes "
        "are taken as given (not checked against the decoded content); every other "
        "caller's, and every caller's without mutual TLS, are checked; '' checks all",
    )
