"""The tags that authenticate every stored Redis entry (`redis_format`).

With a key (`--cache-mac-key-file`, a secret every encoder shares) each tag is a keyed
BLAKE2b MAC: whoever can write to Redis but does not hold the key cannot make an entry
an encoder will serve. Without one, the same construction unkeyed: checksums that catch
damage, and nothing else, since anyone can recompute them.

Every tag covers the entry's binding (its Redis key: model fingerprint and content hash,
so an entry moved under another key fails) and its fixed header; a row group's tag also
covers the group's index and bytes. Headers and row groups are told apart by BLAKE2b's
personalization, so no tag of one kind is ever a valid tag of the other.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from pathlib import Path

MAC_BYTES = 16
# The key file's bytes are hashed into the MAC key: any secret of at least this many
# bytes does (e.g. `openssl rand -hex 32`, 256 bits as 64 hex digits).
MIN_KEY_FILE_BYTES = 32
_KEY_BYTES = 32
_LENGTH = struct.Struct("<Q")
_GROUP_INDEX = struct.Struct("<I")
_HEADER_PERSON = b"tessera-hdr-v2"
_GROUP_PERSON = b"tessera-grp-v2"
_KEY_PERSON = b"tessera-key-v2"
_KEY_ID_PERSON = b"tessera-kid-v2"


class MacKeyError(ValueError):
    """A MAC key file that cannot be used (missing, unreadable, too short)."""


@dataclass(frozen=True)
class EntryMac:
    """Computes entry tags; `key` empty means unkeyed checksums."""

    key: bytes = field(default=b"", repr=False)

    @classmethod
    def from_file(cls, path: str | Path) -> EntryMac:
        """The MAC key derived from a secret file (surrounding whitespace ignored, so a
        trailing newline from `echo` or `openssl` does not matter)."""
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as error:
            raise MacKeyError(f"cannot read the cache MAC key file {path}: {error}") from None
        if len(secret) < MIN_KEY_FILE_BYTES:
            raise MacKeyError(
                f"the cache MAC key file {path} holds {len(secret)} bytes; give at least "
                f"{MIN_KEY_FILE_BYTES} random bytes (e.g. `openssl rand -hex 32`)"
            )
        derived = hashlib.blake2b(secret, digest_size=_KEY_BYTES, person=_KEY_PERSON)
        return cls(derived.digest())

    @property
    def keyed(self) -> bool:
        return bool(self.key)

    @property
    def kind(self) -> str:
        """What the tags are, for messages."""
        return "MAC" if self.key else "checksum"

    @property
    def key_id(self) -> str:
        """A short public name of the key, part of every Redis key name: encoders with
        other keys (or none) use other names, so during a rollout or a key rotation they
        miss each other's entries instead of deleting them as forged. Four bytes of a
        hash of a 256-bit key tell an attacker nothing useful about it."""
        if not self.key:
            return "open"
        return hashlib.blake2b(self.key, digest_size=4, person=_KEY_ID_PERSON).hexdigest()

    def header_tag(self, binding: bytes, fixed: bytes) -> bytes:
        return self._start(_HEADER_PERSON, binding, fixed).digest()

    def group_tagger(self, binding: bytes, fixed: bytes) -> GroupTagger:
        """Tags groups of one entry; the common prefix is hashed once."""
        return GroupTagger(self._start(_GROUP_PERSON, binding, fixed))

    def _start(self, person: bytes, binding: bytes, fixed: bytes) -> hashlib.blake2b:
        digest = hashlib.blake2b(digest_size=MAC_BYTES, key=self.key, person=person)
        # Length-framed so (binding, header) pairs cannot run into each other.
        digest.update(_LENGTH.pack(len(binding)))
        digest.update(binding)
        digest.update(fixed)
        return digest


UNKEYED = EntryMac()


class GroupTagger:
    """The tag of each row group of one entry."""

    def __init__(self, base: hashlib.blake2b) -> None:
        self._base = base

    def tag(self, group: int, group_bytes: bytes | memoryview) -> bytes:
        digest = self._base.copy()
        digest.update(_GROUP_INDEX.pack(group))
        digest.update(group_bytes)
        return digest.digest()
