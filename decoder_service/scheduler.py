"""Chooses what each engine step runs. Works on request state and block bookkeeping only,
never on tensors; what it hands the model runner is plain data (`SchedulerOutput`), and
`update_from_output` does its bookkeeping after the forward.

Per step, within `max_num_batched_tokens`:
1. every running request that is decoding gets its one token;
2. waiting requests are admitted, oldest first, while fewer than `max_num_seqs` run and
   the KV cache holds their first chunk (the blocks are taken at once);
3. running requests with pending prompt (or recompute) tokens get their next chunk, the
   one closest to its first token first (least remaining prefill), while the step's
   prefill chunks hold at most `max_prefill_tokens_per_step` tokens (the first chunk
   always runs) and at most `max_prefills_per_step` prompts. A request running for more
   than `max_prefill_age_steps` steps goes before all younger ones (oldest first), so a
   long prompt is never starved by a stream of short ones.
A long prompt therefore never stalls requests that are decoding, and a burst of prompts
finishes one prompt after another instead of all of them together at the end. The
prefill token budget is what bounds the decoding requests' inter-token latency (a step's
cost grows with its tokens); counted in tokens, it packs several small chunks into the
step where one large chunk would have run, so small chunks do not slow the prompts down.

Worked example, a prefill budget of 128 tokens, chunk 128: prompt A (300 tokens)
arrives just before B (130). B has less left, so step 1 runs B[0:128), step 2 B[128:130)
and B samples its first token; A's first chunk does not fit beside B's 2 tokens, so A
runs in steps 3-5. B's first token has waited for 130 tokens of compute, A's for 430. In
lockstep (both every step) B's would have waited for 386. With a budget of 512 tokens
step 1 runs B[0:128) and A[0:128), step 2 B[128:130) and A[128:256) (B's first token),
step 3 A[256:300).

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
from tessera.placeholders import PlaceholderRange, atomic_block_floor

# Effectively no limit: every prompt may get a chunk in the same step.
UNLIMITED = 1 << 30


@dataclass(frozen=True)
class ScheduledChunk:
    """Compute positions `[start, end)` of one request in this step: all the model
    runner needs, as plain values."""

    request_id: str
    start: int
    end: int
    token_ids: tuple[int, ...]  # the tokens at [start, end)
    num_prompt_tokens: int
    items: tuple[PlaceholderRange, ...]  # the request's media placeholder ranges
    block_table: tuple[int, ...]
    samples: bool  # the last position's logits choose the next token

    @property
    def num_tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: tuple[ScheduledChunk, ...]
    admitted: tuple[str, ...]  # request ids, in admission order
    preempted: tuple[str, ...]
    budget: int  # tokens left of the step's budget

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


@dataclass
class StepUpdate:
    """What `update_from_output` did, for the engine to act on."""

    advanced: list[RequestState] = field(default_factory=list)  # chunk recorded
    sampling: list[RequestState] = field(default_factory=list)  # at their last token
    failed: list[tuple[RequestState, Exception]] = field(default_factory=list)


@dataclass
class _Plan:
    """The step being built."""

    budget: int
    prefill_budget: int  # prefill tokens left this step
    work: list[tuple[RequestState, int, int]] = field(default_factory=list)
    admitted: list[RequestState] = field(default_factory=list)
    preempted: list[RequestState] = field(default_factory=list)
    num_prefills: int = 0


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_prefills_per_step: int = UNLIMITED,
        max_prefill_age_steps: int = 64,
        max_prefill_tokens_per_step: int = UNLIMITED,
    ):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefills_per_step = max_prefills_per_step
        self.max_prefill_age_steps = max_prefill_age_steps
        self.max_prefill_tokens_per_step = max_prefill_tokens_per_step
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self._admitted_at: dict[str, int] = {}  # request id -> step of its admission

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
        self._admitted_at.pop(request.request_id, None)
        self.kv.free(request.request_id)

    def schedule(self) -> SchedulerOutput:
        plan = _Plan(
            budget=self.max_num_batched_tokens, prefill_budget=self.max_prefill_tokens_per_step
        )
        for request in [r for r in self.running if r.is_decoding]:
            if request in self.running:
                self._schedule_running(request, plan)
        if not plan.preempted:
            self._admit(plan)
        for request in self._prefill_order(plan):
            if plan.preempted or plan.num_prefills >= self.max_prefills_per_step:
                break
            if request in self.running:
                plan.num_prefills += self._schedule_running(request, plan, prefill=True)
        self.num_steps += 1
        return SchedulerOutput(
            tuple(self._chunk(request, start, end) for request, start, end in plan.work),
            tuple(r.request_id for r in plan.admitted),
            tuple(r.request_id for r in plan.preempted),
            plan.budget,
        )

    def update_from_output(self, output: SchedulerOutput) -> StepUpdate:
        """After the forward: each chunk's positions are now in the KV cache, and full
        blocks are offered to the prefix cache. A request gone while the forward ran
        (finished, cancelled, preempted) is skipped; one whose bookkeeping fails is
        reported alone, the others go on."""
        by_id = {request.request_id: request for request in self.running}
        update = StepUpdate()
        for chunk in output.chunks:
            request = by_id.get(chunk.request_id)
            if request is None or request.finished:
                continue
            try:
                request.num_computed_tokens = chunk.end
                self._cache_blocks(request)
            except Exception as error:
                update.failed.append((request, error))
                continue
            update.advanced.append(request)
            if chunk.samples:
                update.sampling.append(request)
        return update

    # -- the three phases ----------------------------------------------------------------

    def _schedule_running(self, request: RequestState, plan: _Plan, prefill: bool = False) -> bool:
        """Schedules the request's next chunk if it can run; True if it got one."""
        chunk = request.next_chunk()
        if chunk is None or not self._runnable(request, chunk, plan, prefill):
            return False
        while not self.kv.allocate(request.request_id, chunk[1]):
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is request:
                return False
        self._add_work(request, chunk, plan)
        if prefill:
            plan.prefill_budget -= chunk[1] - chunk[0]
        return True

    def _admit(self, plan: _Plan) -> None:
        """Admits waiting requests, oldest first, with their first chunk's blocks."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            hits = self._prefix_hits(request)
            first_chunk = request.next_chunk(len(hits) * self.kv.block_size)
            assert first_chunk is not None  # at least one token is left to compute
            free_after_hits = self.kv.num_free_blocks - self.kv.num_free_among(hits)
            if self.kv.blocks_for(first_chunk[1]) - len(hits) > free_after_hits:
                return  # oldest first: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.kv.record_lookup(request.num_tokens, len(hits))
            self.kv.start(request.request_id, hits)
            self.kv.allocate(request.request_id, first_chunk[1])
            request.num_computed_tokens = len(hits) * self.kv.block_size
            if not request.admitted:
                request.stats.num_cached_prompt_tokens = request.num_computed_tokens
                request.admitted = True
            self._admitted_at[request.request_id] = self.num_steps
            self.running.append(request)
            plan.admitted.append(request)

    def _prefill_order(self, plan: _Plan) -> list[RequestState]:
        """Running requests with no work yet this step (pending prompt or recompute
        tokens; or a request just readmitted whose prefix hits left it one token short),
        the closest to its first token first; those running longer than the age bound
        before all others, oldest first."""

        def priority(request: RequestState) -> tuple[int, int, int]:
            age = self.num_steps - self._admitted_at.get(request.request_id, self.num_steps)
            if age > self.max_prefill_age_steps:
                return (0, -age, 0)
            return (1, request.num_tokens - request.num_computed_tokens, -age)

        scheduled = {id(work[0]) for work in plan.work}
        prefilling = [r for r in self.running if id(r) not in scheduled]
        return sorted(prefilling, key=priority)  # stable: ties keep running order

    # -- helpers -------------------------------------------------------------------------

    def _prefix_hits(self, request: RequestState) -> list[int]:
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
            hits = hits[: atomic_block_floor(request.spec.ranges, len(hits), self.kv.block_size)]
        return hits

    def _runnable(
        self, request: RequestState, chunk: tuple[int, int], plan: _Plan, prefill: bool
    ) -> bool:
        if request.chunk_needs_rows(*chunk) and chunk not in request.ready_chunks:
            return False
        size = chunk[1] - chunk[0]
        # The first piece of work (and the first prefill chunk) always runs, so a budget
        # below one chunk cannot starve anybody.
        if prefill and size > plan.prefill_budget and plan.num_prefills:
            return False
        return size <= plan.budget or not plan.work

    def _add_work(self, request: RequestState, chunk: tuple[int, int], plan: _Plan) -> None:
        plan.work.append((request, chunk[0], chunk[1]))
        plan.budget -= chunk[1] - chunk[0]

    def _chunk(self, request: RequestState, start: int, end: int) -> ScheduledChunk:
        return ScheduledChunk(
            request.request_id,
            start,
            end,
            tuple(request.token_at(p) for p in range(start, end)),
            request.num_prompt_tokens,
            tuple(request.spec.ranges),
            tuple(self.kv.block_table(request.request_id)),
            samples=end == request.num_tokens,
        )

    def _cache_blocks(self, request: RequestState) -> None:
        kv = self.kv
        if not kv.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // kv.block_size
        if len(request.block_hashes) < num_full:
            request.block_hashes = block_hashes(
                [request.token_at(p) for p in range(num_full * kv.block_size)],
                request.spec.ranges,
                kv.block_size,
                known=request.block_hashes,
                salt=request.spec.cache_salt,
            )
        kv.cache_full_blocks(request.request_id, request.block_hashes, num_full)

    def _preempt(self, request: RequestState, plan: _Plan) -> None:
        self.running.remove(request)
        self.kv.free(request.request_id)
        self._admitted_at.pop(request.request_id, None)
        request.num_computed_tokens = 0
        request.ready_chunks.clear()
        request.stats.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        plan.preempted.append(request)
        if request in plan.admitted:  # admitted this step: it simply waits again
            plan.admitted.remove(request)
        for work in [w for w in plan.work if w[0] is request]:
            plan.work.remove(work)
            plan.budget += work[2] - work[1]
