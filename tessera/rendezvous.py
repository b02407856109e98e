"""Ranking encoders for an item by its content hash, the same way in every process.

The gateway sends an item to the first encoder of this ranking and lists the ranking to
the decoder as hints; the decoder falls back on the same ranking over the encoders it
discovered itself, so both land on the encoder that already holds the item.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from tessera.replicas import ReplicaSet


def rendezvous_order(content_hash: str, addresses: Sequence[str]) -> list[str]:
    """Encoders ranked for an item, best first (highest-random-weight hashing).

    Every process ranks the same way, an item keeps its encoder while that encoder lives,
    and removing an encoder moves only the items it ranked first.
    """

    def weight(address: str) -> bytes:
        return hashlib.blake2b(f"{address}|{content_hash}".encode(), digest_size=8).digest()

    return sorted(addresses, key=weight, reverse=True)


def encoder_order(content_hash: str, replicas: ReplicaSet) -> list[str]:
    """Live encoders by rendezvous rank, then the ones set aside (a last resort)."""
    live = rendezvous_order(content_hash, replicas.live())
    return live + [a for a in rendezvous_order(content_hash, replicas.addresses) if a not in live]
