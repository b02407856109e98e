"""Paged KV cache bookkeeping: fixed-size blocks, per-request block tables, a free list,
and prefix caching. Plain Python: the tensors live in `paged_attention.PagedKVStore`.

Prefix caching keeps a full block's contents addressable by its hash (see
`block_hash.py`) after its request is gone. Such a block sits in the free list but is
only overwritten when no never-used block is left, least recently freed first; a new
request whose prompt starts with the same blocks takes them instead of computing them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None


@dataclass(frozen=True)
class KVCacheStats:
    num_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_prefix_queries: int
    num_prefix_hit_blocks: int
    # In tokens, as vLLM's prefix_cache_queries: every prompt token looked up.
    num_prefix_query_tokens: int


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [Block(i) for i in range(num_blocks)]
        # Unreferenced blocks, next to be reused first. Blocks without a hash are
        # reused before cached ones, and cached ones least recently freed first.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, int] = {}
        self._tables: dict[str, list[int]] = {}
        self._num_prefix_queries = 0
        self._num_prefix_hit_blocks = 0
        self._num_prefix_query_tokens = 0

    # -- queries ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def num_free_among(self, block_ids: Sequence[int]) -> int:
        """How many of these blocks sit in the free list (cached, unreferenced)."""
        return sum(1 for block_id in block_ids if block_id in self._free)

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def stats(self) -> KVCacheStats:
        return KVCacheStats(
            num_blocks=self.num_blocks,
            num_free_blocks=self.num_free_blocks,
            num_cached_blocks=len(self._cached),
            num_prefix_queries=self._num_prefix_queries,
            num_prefix_hit_blocks=self._num_prefix_hit_blocks,
            num_prefix_query_tokens=self._num_prefix_query_tokens,
        )

    # -- prefix caching ------------------------------------------------------------------

    def find_prefix(self, block_hashes: Sequence[bytes], max_blocks: int) -> list[int]:
        """The longest run of leading blocks already cached, at most `max_blocks`."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        for block_hash in block_hashes[:max_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def record_lookup(self, num_tokens: int, num_hit_blocks: int) -> None:
        """Counts one admission's lookup: its prompt's `num_tokens` queried (in tokens, as
        vLLM's prefix_cache_queries) and the blocks it resumed from. Counted once the
        request is admitted, not per attempt, so a request that waits is not counted
        again each step."""
        if not self.enable_prefix_caching:
            return
        self._num_prefix_queries += 1
        self._num_prefix_query_tokens += num_tokens
        self._num_prefix_hit_blocks += num_hit_blocks

    def cache_full_blocks(
        self, request_id: str, block_hashes: Sequence[bytes], num_full_blocks: int
    ) -> None:
        """Makes the request's first `num_full_blocks` blocks findable by their hashes."""
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request_id, [])
        for index in range(min(num_full_blocks, len(table), len(block_hashes))):
            block = self._blocks[table[index]]
            if block.block_hash is not None:
                continue
            block_hash = block_hashes[index]
            if block_hash in self._cached:
                continue  # an identical block is cached already; this one stays private
            block.block_hash = block_hash
            self._cached[block_hash] = block.block_id

    # -- allocation ---------------------------------------------------------------------

    def start(self, request_id: str, cached_block_ids: Sequence[int]) -> None:
        """Gives a request its table, beginning with the prefix blocks it found."""
        if request_id in self._tables:
            raise ValueError(f"request {request_id} already holds blocks")
        for block_id in cached_block_ids:
            self._reference(self._blocks[block_id])
        self._tables[request_id] = list(cached_block_ids)

    def can_allocate(self, request_id: str, num_tokens: int) -> bool:
        missing = self.blocks_for(num_tokens) - len(self._tables.get(request_id, []))
        return missing <= self.num_free_blocks

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grows the request's table to hold `num_tokens`; False (and no change) if the
        free list is too short."""
        table = self._tables.get(request_id, [])
        missing = self.blocks_for(num_tokens) - len(table)
        if missing > self.num_free_blocks:
            return False
        self._tables[request_id] = table
        for _ in range(missing):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.block_hash is not None:  # its old contents are about to be overwritten
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_count = 1
            table.append(block_id)
        return True

    def free(self, request_id: str) -> None:
        """Drops the request's references; tail blocks become reusable first."""
        for block_id in reversed(self._tables.pop(request_id, [])):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
                if block.block_hash is None:
                    self._free.move_to_end(block_id, last=False)

    def _reference(self, block: Block) -> None:
        if block.ref_count == 0:
            del self._free[block.block_id]
        block.ref_count += 1
