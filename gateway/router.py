"""Choosing decoders by load (encoders are ranked by content hash: tessera.rendezvous)."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.replicas import ReplicaSet


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
