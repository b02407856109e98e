"""The encoder's in-memory cache (L1): an LRU bounded in bytes whose entries can be pinned.

An entry pinned by a lease that has not run out is never evicted: a prefill still needs
its rows. The decoder releases the lease once the item's positions are in its KV cache;
a crashed decoder's lease simply runs out. When pinned entries alone exceed the budget
the cache stays over it rather than fail a request, and counts the overflow.

Not thread-safe: the encoder touches it from its event loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tessera.tensor_codec import RowBlock


@dataclass(frozen=True)
class Lease:
    owner: str
    seconds: float


@dataclass
class _Entry:
    block: RowBlock
    # owner -> monotonic expiry time
    leases: dict[str, float] = field(default_factory=dict)

    def is_pinned(self, now: float) -> bool:
        expired = [owner for owner, expiry in self.leases.items() if expiry <= now]
        for owner in expired:
            del self.leases[owner]
        return bool(self.leases)


@dataclass
class MemoryStoreStats:
    num_evictions: int = 0
    num_over_budget_inserts: int = 0


class MemoryStore:
    """content_hash -> RowBlock, least recently used evicted first, pins respected."""

    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._num_bytes = 0
        self.stats = MemoryStoreStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, content_hash: str) -> bool:
        return content_hash in self._entries

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def get(self, content_hash: str, lease: Lease | None = None) -> RowBlock | None:
        """The entry (now most recently used, pinned by `lease` if given) or None."""
        entry = self._entries.get(content_hash)
        if entry is None:
            return None
        self._entries.move_to_end(content_hash)
        if lease is not None:
            entry.leases[lease.owner] = self._clock() + lease.seconds
        return entry.block

    def put(self, content_hash: str, block: RowBlock, lease: Lease | None = None) -> None:
        """Inserts (or refreshes) an entry, then evicts unpinned entries over budget."""
        if content_hash not in self._entries:
            self._entries[content_hash] = _Entry(block)
            self._num_bytes += len(block.data)
        self.get(content_hash, lease)
        self._evict_over_budget()

    def release(self, owner: str, content_hashes: Iterable[str] | None = None) -> int:
        """Drops `owner`'s pins (on the named entries, or all); returns how many."""
        names = self._entries.keys() if content_hashes is None else content_hashes
        released = 0
        for name in list(names):
            entry = self._entries.get(name)
            if entry is not None and entry.leases.pop(owner, None) is not None:
                released += 1
        self._evict_over_budget()
        return released

    def _evict_over_budget(self) -> None:
        if self._num_bytes <= self.max_bytes:
            return
        now = self._clock()
        for name in list(self._entries):
            if self._num_bytes <= self.max_bytes:
                return
            entry = self._entries[name]
            if entry.is_pinned(now):
                continue
            del self._entries[name]
            self._num_bytes -= len(entry.block.data)
            self.stats.num_evictions += 1
        if self._num_bytes > self.max_bytes:
            self.stats.num_over_budget_inserts += 1
