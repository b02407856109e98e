"""Paged KV cache bookkeeping: block counts, the free list's reuse order, and prefix
caching (find, share, reuse for new content)."""

from __future__ import annotations

import pytest

from decoder_service.kv_cache import KVCacheManager


def hashes(*names: str) -> list[bytes]:
    return [name.encode().ljust(16, b"-") for name in names]


def check_consistent(kv: KVCacheManager) -> None:
    """Reference counts match the tables; the free list is exactly the unreferenced blocks;
    the hash index points at blocks carrying that hash."""
    counts = [0] * kv.num_blocks
    for table in kv._tables.values():
        assert len(set(table)) == len(table)
        for block_id in table:
            counts[block_id] += 1
    for block in kv._blocks:
        assert block.ref_count == counts[block.block_id]
        assert (block.block_id in kv._free) == (block.ref_count == 0)
    assert {h: b for h, b in kv._cached.items()} == {
        b.block_hash: b.block_id for b in kv._blocks if b.block_hash is not None
    }


def test_rejects_an_empty_cache():
    with pytest.raises(ValueError):
        KVCacheManager(0, 4, True)
    with pytest.raises(ValueError):
        KVCacheManager(4, 0, True)


def test_blocks_for_rounds_up():
    kv = KVCacheManager(8, 4, True)
    assert [kv.blocks_for(n) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_allocate_and_free_counts():
    kv = KVCacheManager(8, 4, True)
    assert kv.num_free_blocks == 8
    assert kv.allocate("a", 5)
    assert len(kv.block_table("a")) == 2
    assert kv.num_free_blocks == 6
    assert kv.allocate("a", 8)  # still fits in two blocks
    assert kv.num_free_blocks == 6
    assert kv.allocate("a", 9)
    assert len(kv.block_table("a")) == 3
    assert kv.allocate("a", 3)  # never shrinks
    assert len(kv.block_table("a")) == 3
    assert kv.allocate("b", 1)
    assert kv.num_free_blocks == 4
    assert not set(kv.block_table("a")) & set(kv.block_table("b"))
    assert all(kv._blocks[b].ref_count == 1 for b in kv.block_table("a") + kv.block_table("b"))
    check_consistent(kv)
    kv.free("a")
    assert kv.num_free_blocks == 7
    assert kv.block_table("a") == []
    kv.free("a")  # freeing twice is harmless
    kv.free("b")
    assert kv.num_free_blocks == 8
    assert kv.stats().num_free_blocks == 8
    check_consistent(kv)


def test_allocate_refuses_when_short_and_changes_nothing():
    kv = KVCacheManager(4, 2, True)
    assert kv.allocate("a", 4)
    table = list(kv.block_table("a"))
    assert not kv.can_allocate("a", 9)
    assert not kv.allocate("a", 9)  # needs 3 more, 2 free
    assert kv.block_table("a") == table
    assert kv.num_free_blocks == 2
    assert not kv.allocate("b", 5)
    assert kv.block_table("b") == []
    assert kv.num_free_blocks == 2
    assert kv.can_allocate("a", 8)
    assert kv.allocate("a", 8)
    assert kv.num_free_blocks == 0
    check_consistent(kv)


def test_uncached_blocks_are_reused_before_cached_ones_least_recently_freed_first():
    kv = KVCacheManager(6, 2, True)
    assert kv.allocate("a", 4)  # blocks 0, 1
    assert kv.allocate("b", 4)  # blocks 2, 3
    assert kv.allocate("c", 2)  # block 4
    assert kv.block_table("a") == [0, 1] and kv.block_table("b") == [2, 3]
    kv.cache_full_blocks("a", hashes("a0", "a1"), 2)
    kv.cache_full_blocks("b", hashes("b0", "b1"), 2)
    kv.free("a")  # cached: freed first, so reused first among cached ones
    kv.free("b")
    kv.free("c")  # uncached: reused before any cached block although freed last
    order = []
    for n in range(1, 7):
        assert kv.allocate("d", 2 * n)
        order.append(kv.block_table("d")[-1])
    # Never-used 5 and freed-uncached 4 first, then a's blocks (tail first, so the
    # leading blocks of a prefix stay findable longest), then b's.
    assert set(order[:2]) == {4, 5}
    assert order[2:] == [1, 0, 3, 2]
    check_consistent(kv)


def test_a_cached_block_freed_again_moves_to_the_back():
    kv = KVCacheManager(3, 1, True)
    for name in ("a", "b"):
        assert kv.allocate(name, 1)
        kv.cache_full_blocks(name, hashes(name), 1)
    kv.free("a")
    kv.free("b")
    # Reuse a's block by prefix, then free it: now b's block is the least recently freed.
    kv.start("a2", kv.find_prefix(hashes("a"), 1))
    kv.free("a2")
    assert kv.allocate("x", 2)
    assert kv.block_table("x") == [2, 1]  # never-used block 2, then b's block
    assert kv.find_prefix(hashes("a"), 1) == [0]
    assert kv.find_prefix(hashes("b"), 1) == []


def test_find_prefix_returns_leading_matches_and_stops_at_the_first_miss():
    kv = KVCacheManager(8, 2, True)
    assert kv.allocate("a", 8)
    table = kv.block_table("a")
    kv.cache_full_blocks("a", hashes("h0", "h1", "h2", "h3"), 4)
    assert kv.find_prefix(hashes("h0", "h1", "h2", "h3"), 4) == table
    assert kv.find_prefix(hashes("h0", "h1", "h2", "h3", "h4"), 10) == table
    assert kv.find_prefix(hashes("h0", "h1", "h2", "h3"), 2) == table[:2]
    assert kv.find_prefix(hashes("h0", "h1", "h2", "h3"), 0) == []
    assert kv.find_prefix(hashes("h0", "zz", "h2", "h3"), 4) == table[:1]
    assert kv.find_prefix(hashes("zz", "h1", "h2"), 4) == []
    stats = kv.stats()
    assert stats.num_prefix_queries == 0  # looking is not admitting (record_lookup)
    assert stats.num_cached_blocks == 4


def test_record_lookup_counts_admissions_tokens_and_hits_only_with_prefix_caching():
    kv = KVCacheManager(8, 2, True)
    kv.record_lookup(num_tokens=7, num_hit_blocks=3)
    kv.record_lookup(num_tokens=5, num_hit_blocks=0)
    stats = kv.stats()
    assert (stats.num_prefix_queries, stats.num_prefix_query_tokens) == (2, 12)
    assert stats.num_prefix_hit_blocks == 3
    off = KVCacheManager(8, 2, False)
    off.record_lookup(num_tokens=7, num_hit_blocks=0)
    assert off.stats().num_prefix_queries == off.stats().num_prefix_query_tokens == 0


def test_cache_full_blocks_caches_only_what_it_is_told():
    kv = KVCacheManager(8, 2, True)
    assert kv.allocate("a", 6)
    kv.cache_full_blocks("a", hashes("h0", "h1", "h2"), 2)
    assert kv.stats().num_cached_blocks == 2
    assert kv.find_prefix(hashes("h0", "h1", "h2"), 3) == kv.block_table("a")[:2]
    kv.cache_full_blocks("a", hashes("h0", "h1"), 3)  # fewer hashes than blocks: no more
    assert kv.stats().num_cached_blocks == 2
    kv.cache_full_blocks("a", hashes("h0", "h1", "h2", "h3"), 9)  # limited by the table
    assert kv.stats().num_cached_blocks == 3
    # Caching again does not rename a block.
    kv.cache_full_blocks("a", hashes("x0", "x1", "x2"), 3)
    assert kv.find_prefix(hashes("x0"), 1) == []
    kv.cache_full_blocks("nobody", hashes("n0"), 1)
    assert kv.stats().num_cached_blocks == 3
    check_consistent(kv)


def test_start_with_cached_blocks_takes_them_off_the_free_list():
    kv = KVCacheManager(6, 2, True)
    assert kv.allocate("a", 6)
    kv.cache_full_blocks("a", hashes("h0", "h1", "h2"), 3)
    prefix = kv.block_table("a")[:2]
    kv.free("a")
    assert kv.num_free_blocks == 6
    hits = kv.find_prefix(hashes("h0", "h1", "q"), 3)
    assert hits == prefix
    assert kv.num_free_among(hits) == 2
    kv.start("b", hits)
    assert kv.block_table("b") == prefix
    assert kv.num_free_blocks == 4
    assert kv.num_free_among(hits) == 0
    assert all(kv._blocks[b].ref_count == 1 for b in hits)
    assert kv.allocate("b", 7)  # two more blocks after the prefix
    assert kv.block_table("b")[:2] == prefix
    assert len(kv.block_table("b")) == 4
    # New blocks never come out of the referenced prefix.
    assert not set(kv.block_table("b")[2:]) & set(prefix)
    check_consistent(kv)
    with pytest.raises(ValueError):
        kv.start("b", [])


def test_two_requests_share_a_prefix_block():
    kv = KVCacheManager(6, 2, True)
    assert kv.allocate("a", 5)
    kv.cache_full_blocks("a", hashes("h0", "h1"), 2)
    hits = kv.find_prefix(hashes("h0", "h1"), 2)
    assert hits == kv.block_table("a")[:2]
    assert kv.num_free_among(hits) == 0  # still held by a
    free_before = kv.num_free_blocks
    kv.start("b", hits)
    assert kv.num_free_blocks == free_before
    assert [kv._blocks[b].ref_count for b in hits] == [2, 2]
    check_consistent(kv)
    kv.free("a")
    assert [kv._blocks[b].ref_count for b in hits] == [1, 1]
    assert kv.num_free_among(hits) == 0
    assert kv.num_free_blocks == free_before + 1  # only a's private tail block
    kv.free("b")
    assert kv.num_free_among(hits) == 2
    assert kv.num_free_blocks == 6
    assert kv.find_prefix(hashes("h0", "h1"), 2) == hits  # still cached after both left
    check_consistent(kv)


def test_an_identical_block_cached_twice_stays_private():
    kv = KVCacheManager(4, 2, True)
    assert kv.allocate("a", 2)
    assert kv.allocate("b", 2)
    kv.cache_full_blocks("a", hashes("h0"), 1)
    kv.cache_full_blocks("b", hashes("h0"), 1)
    assert kv.find_prefix(hashes("h0"), 1) == kv.block_table("a")
    assert kv._blocks[kv.block_table("b")[0]].block_hash is None
    check_consistent(kv)


def test_reusing_a_cached_block_for_new_content_forgets_its_hash():
    kv = KVCacheManager(3, 2, True)
    assert kv.allocate("a", 4)
    kv.cache_full_blocks("a", hashes("h0", "h1"), 2)
    kv.free("a")
    assert kv.find_prefix(hashes("h0", "h1"), 2) == [0, 1]
    assert kv.allocate("b", 2)  # the never-used block 2 first: nothing forgotten
    assert kv.block_table("b") == [2]
    assert kv.find_prefix(hashes("h0", "h1"), 2) == [0, 1]
    assert kv.allocate("b", 4)  # now a cached block: a's tail, block 1
    assert kv.block_table("b") == [2, 1]
    assert kv._blocks[1].block_hash is None
    assert kv.find_prefix(hashes("h1"), 1) == []
    assert kv.find_prefix(hashes("h0", "h1"), 2) == [0]
    assert kv.stats().num_cached_blocks == 1
    # The block can be cached under its new content.
    kv.cache_full_blocks("b", hashes("g0", "g1"), 2)
    assert kv.find_prefix(hashes("g0", "g1"), 2) == [2, 1]
    check_consistent(kv)


def test_disabled_prefix_caching_finds_nothing():
    kv = KVCacheManager(4, 2, False)
    assert kv.allocate("a", 4)
    kv.cache_full_blocks("a", hashes("h0", "h1"), 2)
    kv.free("a")
    assert kv.find_prefix(hashes("h0", "h1"), 2) == []
    stats = kv.stats()
    assert stats.num_cached_blocks == 0
    assert stats.num_prefix_queries == 0
    assert all(block.block_hash is None for block in kv._blocks)


def test_num_free_among():
    kv = KVCacheManager(5, 1, True)
    assert kv.allocate("a", 2)
    held = kv.block_table("a")
    free = [b for b in range(5) if b not in held]
    assert kv.num_free_among([]) == 0
    assert kv.num_free_among(held) == 0
    assert kv.num_free_among(free) == 3
    assert kv.num_free_among([*held, *free]) == 3
    kv.free("a")
    assert kv.num_free_among(held) == 2
