"""Choosing replicas: encoders by content hash (cache affinity), decoders by load."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def rendezvous_order(content_hash: str, addresses: Sequence[str]) -> list[str]:
    """Encoders ranked for an item, best first (highest-random-weight hashing).

    Every gateway ranks the same way, an item keeps its encoder while that encoder lives,
    and removing an encoder moves only the items it ranked first.
    """

    def weight(address: str) -> bytes:
        return hashlib.blake2b(f"{address}|{content_hash}".encode(), digest_size=8).digest()

    return sorted(addresses, key=weight, reverse=True)


class DecoderRouter:
    """Least outstanding requests first; ties go to the earliest listed."""

    def __init__(self, addresses: Sequence[str]):
        self._outstanding = {address: 0 for address in addresses}

    def acquire(self) -> str:
        address = min(self._outstanding, key=self._outstanding.__getitem__)
        self._outstanding[address] += 1
        return address

    def release(self, address: str) -> None:
        self._outstanding[address] -= 1
