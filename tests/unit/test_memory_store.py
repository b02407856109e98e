"""The encoder's L1 cache: LRU by bytes, leases pin entries until they run out or are
released (invariant 5 and "eviction under use"). Time is a fake clock."""

from __future__ import annotations

import pytest

from encoder_service.memory_store import Lease, MemoryStore, PinLimits
from tessera.tensor_codec import RowBlock
from tessera.testbed.clock import ManualClock


def block(num_bytes: int = 100) -> RowBlock:
    """A float32 block of `num_bytes` (a multiple of 4) bytes."""
    return RowBlock("float32", 1, num_bytes // 4, bytes(num_bytes))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


# Pin semantics apart from the pin bounds, which have tests of their own below.
UNBOUNDED_PINS = PinLimits(max_pinned_bytes=10**12, max_bytes_per_owner=10**12)


def store_of(max_bytes: int, clock: ManualClock, pins: PinLimits = UNBOUNDED_PINS) -> MemoryStore:
    return MemoryStore(max_bytes, pins, clock=clock)


def names(store: MemoryStore, candidates: str = "abcdefgh") -> set[str]:
    return {name for name in [*candidates, "big"] if name in store}


def test_get_returns_what_was_put(clock):
    store = store_of(1000, clock)
    stored = block()
    store.put("a", stored)
    assert store.get("a") is stored
    assert store.get("missing") is None
    assert "a" in store and len(store) == 1 and store.num_bytes == 100


def test_put_twice_counts_bytes_once(clock):
    store = store_of(1000, clock)
    store.put("a", block())
    store.put("a", block())
    assert len(store) == 1 and store.num_bytes == 100


def test_least_recently_used_evicted_first_by_bytes(clock):
    store = store_of(300, clock)
    for name in "abc":
        store.put(name, block())
    assert store.num_bytes == 300 and store.stats.num_evictions == 0
    store.put("d", block())
    assert names(store) == {"b", "c", "d"}
    assert store.num_bytes == 300 and store.stats.num_evictions == 1


def test_a_large_entry_evicts_as_many_as_needed(clock):
    store = store_of(300, clock)
    for name in "abc":
        store.put(name, block())
    store.put("big", block(200))
    assert names(store) == {"c", "big"}
    assert store.num_bytes == 300 and store.stats.num_evictions == 2


def test_get_refreshes_recency(clock):
    store = store_of(300, clock)
    for name in "abc":
        store.put(name, block())
    store.get("a")
    store.put("d", block())
    assert "a" in store and "b" not in store


def test_put_of_an_existing_entry_refreshes_recency(clock):
    store = store_of(300, clock)
    for name in "abc":
        store.put(name, block())
    store.put("a", block())
    store.put("d", block())
    assert "a" in store and "b" not in store


def test_leased_entry_survives_while_its_lease_lives(clock):
    store = store_of(200, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    store.put("b", block())
    clock.advance(9.9)
    store.put("c", block())
    assert "a" in store and "b" not in store and "c" in store


def test_leased_entry_evictable_after_expiry(clock):
    store = store_of(200, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    store.put("b", block())
    clock.advance(10)
    store.put("c", block())
    assert names(store) == {"b", "c"}


def test_leased_entry_evictable_after_release(clock):
    store = store_of(200, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    store.put("b", block())
    assert store.release("req-1", ["a"]) == 1
    store.put("c", block())
    assert "a" not in store


def test_get_with_a_lease_pins(clock):
    store = store_of(200, clock)
    store.put("a", block())
    store.put("b", block())
    store.get("a", Lease("req-1", seconds=5))
    store.get("b")  # "a" is now least recently used, but pinned
    store.put("c", block())
    assert "a" in store and "b" not in store


def test_lease_is_renewed_by_a_later_get(clock):
    store = store_of(100, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    clock.advance(8)
    store.get("a", Lease("req-1", seconds=10))
    clock.advance(8)
    store.put("b", block())  # 16 s after the first lease, 8 s after the renewal
    assert "a" in store


def test_entry_stays_pinned_while_any_owner_holds_it(clock):
    store = store_of(100, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    store.get("a", Lease("req-2", seconds=10))
    assert store.release("req-1") == 1
    store.put("b", block())
    assert "a" in store
    assert store.release("req-2") == 1
    store.put("b", block())
    assert "a" not in store and "b" in store


def test_release_evicts_what_its_pins_kept_over_budget(clock):
    store = store_of(100, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    store.put("b", block(), Lease("req-1", seconds=10))
    assert store.num_bytes == 200
    store.release("req-1")
    assert store.num_bytes == 100 and "b" in store


def test_release_counts(clock):
    store = store_of(10_000, clock)
    for name in "abc":
        store.put(name, block(), Lease("req-1", seconds=10))
    store.get("a", Lease("req-2", seconds=10))
    assert store.release("req-1", ["a", "b", "missing"]) == 2
    assert store.release("req-1", ["a", "b"]) == 0  # already released
    assert store.release("nobody") == 0
    assert store.release("req-1") == 1  # the rest: "c"
    assert store.release("req-2") == 1


def test_only_pinned_entries_over_budget_are_kept_and_counted(clock):
    store = store_of(150, clock)
    store.put("a", block(), Lease("req-1", seconds=10))
    assert store.stats.num_over_budget_inserts == 0
    store.put("b", block(), Lease("req-1", seconds=10))
    assert names(store) == {"a", "b"} and store.num_bytes == 200
    assert store.stats.num_over_budget_inserts == 1
    assert store.stats.num_evictions == 0
    store.put("c", block())  # unpinned: goes, the pinned stay
    assert "c" not in store and store.num_bytes == 200
    assert store.stats.num_over_budget_inserts == 2
    clock.advance(10)
    store.put("d", block())
    assert store.num_bytes <= 150


def test_zero_budget_keeps_nothing_unleased(clock):
    store = store_of(0, clock)
    store.put("a", block())
    assert len(store) == 0 and store.num_bytes == 0
    store.put("b", block(), Lease("req-1", seconds=1))
    assert "b" in store
    store.release("req-1")
    assert len(store) == 0 and store.num_bytes == 0


def test_zero_length_lease_does_not_pin(clock):
    store = store_of(0, clock)
    store.put("a", block(), Lease("req-1", seconds=0))
    assert "a" not in store


def test_default_pin_bounds_are_fractions_of_the_budget():
    limits = MemoryStore(1000).pin_limits
    assert limits == PinLimits(max_pinned_bytes=750, max_bytes_per_owner=125)


def test_one_owner_pins_at_most_its_share(clock):
    store = store_of(10_000, clock, PinLimits(max_pinned_bytes=1000, max_bytes_per_owner=250))
    for name in "abcd":
        store.put(name, block(), Lease("greedy", seconds=300))
    assert store.pinned_bytes_of("greedy") == 200  # "a" and "b"; "c" and "d" would pass 250
    assert store.stats.num_pins_refused == 2
    # Refused pins still store and serve the entry; only its eviction is not held off.
    assert names(store) == {"a", "b", "c", "d"} and store.get("d") is not None
    store.put("e", block(), Lease("other", seconds=300))
    assert store.pinned_bytes_of("other") == 100


def test_all_owners_together_pin_at_most_the_pin_budget(clock):
    store = store_of(10_000, clock, PinLimits(max_pinned_bytes=300, max_bytes_per_owner=1000))
    for index, name in enumerate("abcde"):
        store.put(name, block(), Lease(f"owner-{index}", seconds=300))
    assert store.num_pinned_bytes == 300 and store.stats.num_pins_refused == 2
    # A second owner's pin on an entry already pinned costs the budget nothing.
    store.get("a", Lease("late", seconds=300))
    assert store.num_pinned_bytes == 300 and store.pinned_bytes_of("late") == 100
    assert store.stats.num_pins_refused == 2


def test_pins_that_ran_out_free_their_bytes(clock):
    store = store_of(10_000, clock, PinLimits(max_pinned_bytes=200, max_bytes_per_owner=200))
    store.put("a", block(), Lease("first", seconds=5))
    store.put("b", block(), Lease("first", seconds=5))
    store.put("c", block(), Lease("second", seconds=5))
    assert store.stats.num_pins_refused == 1
    clock.advance(5)
    store.put("d", block(), Lease("second", seconds=5))
    assert store.stats.num_pins_refused == 1
    assert store.pinned_bytes_of("first") == 0 and store.pinned_bytes_of("second") == 100


def test_a_hostile_owner_cannot_keep_the_cache_from_new_items(clock):
    """One owner pinning everything it can: the cache still takes and keeps new items
    of others (what its pins cannot hold is evicted, least recently used first)."""
    store = store_of(1000, clock, PinLimits.of_budget(1000))
    for index in range(50):
        store.put(f"hostile-{index}", block(), Lease("hostile", seconds=300))
    assert store.pinned_bytes_of("hostile") == 100  # 12.5% of 1000, whole blocks
    for name in "abcdefgh":
        store.put(name, block())
    assert names(store) == set("abcdefgh") and store.num_bytes <= 1000


def test_renewing_a_pin_costs_no_bytes(clock):
    store = store_of(10_000, clock, PinLimits(max_pinned_bytes=100, max_bytes_per_owner=100))
    store.put("a", block(), Lease("req-1", seconds=5))
    for _ in range(3):
        clock.advance(4)
        store.get("a", Lease("req-1", seconds=5))
    assert store.pinned_bytes_of("req-1") == 100 and store.stats.num_pins_refused == 0
