"""Chooses what each engine step runs. Works on request state and block bookkeeping only,
never on tensors.

Per step, within `max_num_batched_tokens`: running requests that are decoding get their
one token first, then running requests with pending prompt (or recompute) tokens get
their next chunk, oldest first; then waiting requests are admitted, oldest first, while
fewer than `max_num_seqs` run. A long prompt therefore never stalls requests that are
decoding.

A chunk is always `[n, min(n + max_chunk_tokens, num_tokens))`: if the rest of the
budget cannot hold it, the request waits for the next step rather than take a smaller
piece, so the engine can fetch the rows of the chunks ahead exactly. A chunk that needs
embedding rows runs only once they have arrived; chunks without media never wait.

When the KV cache has no free block for a request, the newest running request is
preempted: its blocks are freed and all its tokens are recomputed once it is admitted
again (greedy output is unchanged).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from decoder_service.block_hash import block_hashes
from decoder_service.kv_cache import KVCacheManager
from decoder_service.request import RequestState
from tessera.placeholders import atomic_block_floor


@dataclass(frozen=True)
class ScheduledWork:
    """Compute positions `[start, end)` of `request` in this step."""

    request: RequestState
    start: int
    end: int
    block_table: tuple[int, ...]
    samples: bool  # the last position's logits choose the next token

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass
class SchedulerOutput:
    work: list[ScheduledWork] = field(default_factory=list)
    admitted: list[RequestState] = field(default_factory=list)
    preempted: list[RequestState] = field(default_factory=list)
    budget: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(item.num_tokens for item in self.work)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.num_preemptions = 0

    def add(self, request: RequestState) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, request: RequestState) -> None:
        """Forgets a finished or cancelled request and frees its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request.request_id)

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput(budget=self.max_num_batched_tokens)
        decoding = [r for r in self.running if r.is_decoding]
        others = [r for r in self.running if not r.is_decoding]
        for request in decoding + others:
            if request in self.running:
                self._schedule_running(request, output)
        if not output.preempted:
            self._admit(output)
        return output

    def _schedule_running(self, request: RequestState, output: SchedulerOutput) -> None:
        chunk = request.next_chunk()
        if chunk is None or not self._runnable(request, chunk, output):
            return
        while not self.kv.allocate(request.request_id, chunk[1]):
            victim = self.running[-1]
            self._preempt(victim, output)
            if victim is request:
                return
        self._add_work(request, chunk, output)

    def _admit(self, output: SchedulerOutput) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs and output.budget > 0:
            request = self.waiting[0]
            request.block_hashes = block_hashes(
                [request.token_at(p) for p in range(request.num_tokens)],
                request.spec.ranges,
                self.kv.block_size,
                known=request.block_hashes,
                salt=request.spec.cache_salt,
            )
            # At least one token must be computed, for the logits of the next one.
            max_hit_blocks = (request.num_tokens - 1) // self.kv.block_size
            hits = self.kv.find_prefix(request.block_hashes, max_hit_blocks)
            if not request.spec.split_items:  # resume at an item boundary, never inside one
                hits = hits[
                    : atomic_block_floor(request.spec.ranges, len(hits), self.kv.block_size)
                ]
            first_chunk = request.next_chunk(len(hits) * self.kv.block_size)
            assert first_chunk is not None  # at least one token is left to compute
            first_chunk_end = first_chunk[1]
            free_after_hits = self.kv.num_free_blocks - self.kv.num_free_among(hits)
            if self.kv.blocks_for(first_chunk_end) - len(hits) > free_after_hits:
                return  # oldest first: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.kv.record_lookup(request.num_tokens, len(hits))
            self.kv.start(request.request_id, hits)
            request.num_computed_tokens = len(hits) * self.kv.block_size
            if not request.admitted:
                request.stats.num_cached_prompt_tokens = request.num_computed_tokens
                request.admitted = True
            self.running.append(request)
            output.admitted.append(request)
            chunk = request.next_chunk()
            if chunk and self._runnable(request, chunk, output):
                self.kv.allocate(request.request_id, chunk[1])
                self._add_work(request, chunk, output)

    def _runnable(
        self, request: RequestState, chunk: tuple[int, int], output: SchedulerOutput
    ) -> bool:
        if request.chunk_needs_rows(*chunk) and chunk not in request.ready_chunks:
            return False
        size = chunk[1] - chunk[0]
        # The first piece of work always runs, so a budget below one chunk cannot
        # starve anybody.
        return size <= output.budget or not output.work

    def _add_work(
        self, request: RequestState, chunk: tuple[int, int], output: SchedulerOutput
    ) -> None:
        output.work.append(
            ScheduledWork(
                request,
                chunk[0],
                chunk[1],
                tuple(self.kv.block_table(request.request_id)),
                samples=chunk[1] == request.num_tokens,
            )
        )
        output.budget -= chunk[1] - chunk[0]

    def _preempt(self, request: RequestState, output: SchedulerOutput) -> None:
        self.running.remove(request)
        self.kv.free(request.request_id)
        request.num_computed_tokens = 0
        request.ready_chunks.clear()
        request.stats.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        output.preempted.append(request)
        for work in [w for w in output.work if w.request is request]:
            output.work.remove(work)
            output.budget += work.num_tokens
