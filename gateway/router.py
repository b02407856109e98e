"""Choosing replicas: encoders by content hash (cache affinity), decoders by load."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gateway.replicas import ReplicaSet


def rendezvous_order(content_hash: str, addresses: Sequence[str]) -> list[str]:
    """Encoders ranked for an item, best first (highest-random-weight hashing).

    Every gateway ranks the same way, an item keeps its encoder while that encoder lives,
    and removing an encoder moves only the items it ranked first.
    """

    def weight(address: str) -> bytes:
        return hashlib.blake2b(f"{address}|{content_hash}".encode(), digest_size=8).digest()

    return sorted(addresses, key=weight, reverse=True)


class DecoderRouter:
    """Least outstanding requests first among the live decoders; ties go to the earliest
    listed."""

    def __init__(self, replicas: ReplicaSet):
        self.replicas = replicas
        self._outstanding: dict[str, int] = {}

    def acquire(self, exclude: Sequence[str] = ()) -> str | None:
        candidates = [a for a in self.replicas.live() if a not in exclude]
        if not candidates:
            return None
        address = min(candidates, key=lambda a: self._outstanding.get(a, 0))
        self._outstanding[address] = self._outstanding.get(address, 0) + 1
        return address

    def release(self, address: str) -> None:
        self._outstanding[address] -= 1


def encoder_order(content_hash: str, replicas: ReplicaSet) -> list[str]:
    """Live encoders by rendezvous rank, then the ones set aside (a last resort)."""
    live = rendezvous_order(content_hash, replicas.live())
    return live + [a for a in rendezvous_order(content_hash, replicas.addresses) if a not in live]
