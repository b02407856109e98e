"""The encoder's in-memory cache (L1): an LRU bounded in bytes whose entries can be pinned.

An entry pinned by a lease that has not run out is never evicted: a prefill still needs
its rows. The decoder releases the lease once the item's positions are in its KV cache;
a crashed decoder's lease simply runs out.

Pins are bounded, so no caller can hold the cache: all pins together cover at most
`PinLimits.max_pinned_bytes`, and one owner's at most `max_bytes_per_owner`. A pin that
would pass either bound is not granted; the entry is still stored and served, only
evictable like any other, and an evicted entry is recomputed (or read from Redis) when
asked for again. A pin is a promise of speed, never of correctness.

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


@dataclass(frozen=True)
class PinLimits:
    """Bounds on pinned bytes: over all owners, and per owner."""

    max_pinned_bytes: int
    max_bytes_per_owner: int

    @classmethod
    def of_budget(
        cls, max_bytes: int, pinned_fraction: float = 0.75, owner_fraction: float = 0.125
    ) -> PinLimits:
        """Fractions of the cache budget: with 2 GiB, 1.5 GiB pinned in all and 256 MiB
        per owner (a request's items), so at least 6 requests' pins fit side by side and
        a quarter of the cache always stays evictable for new items."""
        return cls(int(max_bytes * pinned_fraction), int(max_bytes * owner_fraction))


@dataclass
class _Entry:
    block: RowBlock
    # owner -> monotonic expiry time
    leases: dict[str, float] = field(default_factory=dict)

    @property
    def num_bytes(self) -> int:
        return len(self.block.data)


@dataclass
class MemoryStoreStats:
    num_evictions: int = 0
    num_over_budget_inserts: int = 0
    num_pins_refused: int = 0


class MemoryStore:
    """content_hash -> RowBlock, least recently used evicted first, pins respected."""

    def __init__(
        self,
        max_bytes: int,
        pin_limits: PinLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_bytes = max_bytes
        self.pin_limits = pin_limits or PinLimits.of_budget(max_bytes)
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._num_bytes = 0
        # Entries with at least one pin, and the bytes pinned in all and per owner. Pins
        # that ran out are counted until a sweep drops them (before any refusal).
        self._pinned: dict[str, _Entry] = {}
        self._pinned_bytes = 0
        self._owner_bytes: dict[str, int] = {}
        self.stats = MemoryStoreStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, content_hash: str) -> bool:
        return content_hash in self._entries

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    @property
    def num_pinned_bytes(self) -> int:
        self._sweep(self._clock())
        return self._pinned_bytes

    def get(self, content_hash: str, lease: Lease | None = None) -> RowBlock | None:
        """The entry (now most recently used, pinned by `lease` if the pin bounds allow)
        or None."""
        entry = self._entries.get(content_hash)
        if entry is None:
            return None
        self._entries.move_to_end(content_hash)
        if lease is not None:
            self._pin(content_hash, entry, lease)
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
        names = list(self._pinned) if content_hashes is None else list(content_hashes)
        released = 0
        for name in names:
            entry = self._pinned.get(name)
            if entry is not None and owner in entry.leases:
                self._unpin(name, entry, owner)
                released += 1
        self._evict_over_budget()
        return released

    def pinned_bytes_of(self, owner: str) -> int:
        self._sweep(self._clock())
        return self._owner_bytes.get(owner, 0)

    def _pin(self, name: str, entry: _Entry, lease: Lease) -> None:
        now = self._clock()
        if lease.owner in entry.leases:  # a renewal pins no new bytes
            entry.leases[lease.owner] = max(entry.leases[lease.owner], now + lease.seconds)
            return
        if not self._pin_fits(entry, lease.owner):
            self._sweep(now)
            if not self._pin_fits(entry, lease.owner):
                self.stats.num_pins_refused += 1
                return
        if not entry.leases:
            self._pinned[name] = entry
            self._pinned_bytes += entry.num_bytes
        entry.leases[lease.owner] = now + lease.seconds
        self._owner_bytes[lease.owner] = self._owner_bytes.get(lease.owner, 0) + entry.num_bytes

    def _pin_fits(self, entry: _Entry, owner: str) -> bool:
        limits = self.pin_limits
        owner_bytes = self._owner_bytes.get(owner, 0) + entry.num_bytes
        # A second owner's pin on a pinned entry adds nothing to the bytes pinned in all.
        total = self._pinned_bytes + (0 if entry.leases else entry.num_bytes)
        return owner_bytes <= limits.max_bytes_per_owner and total <= limits.max_pinned_bytes

    def _unpin(self, name: str, entry: _Entry, owner: str) -> None:
        del entry.leases[owner]
        left = self._owner_bytes[owner] - entry.num_bytes
        if left:
            self._owner_bytes[owner] = left
        else:
            del self._owner_bytes[owner]
        if not entry.leases:
            del self._pinned[name]
            self._pinned_bytes -= entry.num_bytes

    def _sweep(self, now: float) -> None:
        """Drops every pin that ran out. Costs one pass over the pinned entries, which
        the pin bounds keep few; it runs only before a refusal, an eviction pass or a
        reading of the totals."""
        for name, entry in list(self._pinned.items()):
            for owner in [o for o, expiry in entry.leases.items() if expiry <= now]:
                self._unpin(name, entry, owner)

    def _evict_over_budget(self) -> None:
        if self._num_bytes <= self.max_bytes:
            return
        self._sweep(self._clock())
        for name in list(self._entries):
            if self._num_bytes <= self.max_bytes:
                return
            entry = self._entries[name]
            if entry.leases:
                continue
            del self._entries[name]
            self._num_bytes -= entry.num_bytes
            self.stats.num_evictions += 1
        if self._num_bytes > self.max_bytes:
            self.stats.num_over_budget_inserts += 1
