"""The scheduler on fake requests, driven by a small simulator that plays the engine.

The simulator does per step what `Engine.step` does, without a model: mark the chunks
whose rows have "arrived" (a fetch started k steps ago), schedule, forget the fetches of
preempted requests, start fetches for the running requests' media chunks, run each work
item, then postprocess (advance `num_computed_tokens`, cache full blocks, append a token
when the work samples, finish a request after `max_tokens` via `scheduler.remove`).

Its "forward" keeps a fake KV store: every slot holds a key naming exactly what the K/V
at that position depend on (all tokens up to it and the media rows among them). A forward
reads positions `[0, start)` through its block table and checks every key, then writes
`[start, end)`; so a wrong prefix-cache hit, a block shared or reused while in use, or a
lost block shows up as a wrong read. Its "sampler" is a function of the tokens whose
logits it reads (like greedy decoding), so outputs are checked against a run without any
scheduler.

Budget rule (what `Scheduler._runnable` promises): the tokens of one step never exceed
`max_num_batched_tokens`, except when a step has exactly one work item: a chunk larger
than the whole budget runs alone, so a budget below one chunk cannot starve anybody.
Decodes are never starved as long as `max_num_seqs <= max_num_batched_tokens` (every
running request's decode fits), which every configuration here respects.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass

import pytest

from decoder_service.kv_cache import KVCacheManager
from decoder_service.request import DecodeSpec, MediaSource, RequestState, SamplingOptions
from decoder_service.scheduler import UNLIMITED, ScheduledChunk, Scheduler, SchedulerOutput
from tessera.placeholders import Modality, PlaceholderRange

PLACEHOLDER = 9
IMAGES = ("ab" * 32, "cd" * 32, "ef" * 32)
NEVER = 10**9


def image(offset: int, length: int, content_hash: str = IMAGES[0]) -> MediaSource:
    return MediaSource(
        PlaceholderRange(Modality.IMAGE, content_hash, offset, length), ("encoder:0",), b""
    )


def make_spec(
    request_id: str,
    prompt: list[int],
    *,
    max_tokens: int = 4,
    chunk: int = 8,
    items: tuple[MediaSource, ...] = (),
    salt: str = "",
) -> DecodeSpec:
    """The tokens under each item become the placeholder id."""
    tokens = list(prompt)
    for item in items:
        tokens[item.range.offset : item.range.end] = [PLACEHOLDER] * item.range.length
    return DecodeSpec(
        request_id=request_id,
        prompt_token_ids=tuple(tokens),
        items=tuple(items),
        sampling=SamplingOptions(max_tokens=max_tokens),
        max_chunk_tokens=chunk,
        cache_salt=salt,
    )


def fake_token(tokens: list[int]) -> int:
    """Stands in for greedy sampling: a function of the tokens whose logits are read."""
    return 1000 + hash(tuple(tokens)) % 30000


def reference_output(spec: DecodeSpec) -> list[int]:
    tokens = list(spec.prompt_token_ids)
    for _ in range(spec.sampling.max_tokens):
        tokens.append(fake_token(tokens))
    return tokens[len(spec.prompt_token_ids) :]


@dataclass
class Arrival:
    step: int
    spec: DecodeSpec
    media_delay: int = 0  # steps from a chunk's fetch starting to its rows being ready


class Simulator:
    """Plays the engine's role around a real Scheduler and KVCacheManager, and checks the
    scheduler's invariants at every step."""

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        budget: int,
        prefix_caching: bool = True,
        max_prefills_per_step: int = UNLIMITED,
        max_prefill_age_steps: int = 64,
        max_prefill_tokens_per_step: int = UNLIMITED,
    ):
        self.kv = KVCacheManager(num_blocks, block_size, prefix_caching)
        self.scheduler = Scheduler(
            self.kv,
            max_num_seqs,
            budget,
            max_prefills_per_step,
            max_prefill_age_steps,
            max_prefill_tokens_per_step,
        )
        self.admitted_at: dict[str, int] = {}  # request id -> step of its last admission
        self.step_index = 0
        self.arrivals: list[Arrival] = []
        self.requests: dict[str, RequestState] = {}
        self.delay: dict[str, int] = {}
        # request id -> chunk -> step its fetch started (the engine's Prefetcher.plan)
        self.fetches: dict[str, dict[tuple[int, int], int]] = {}
        self.finished_at: dict[str, int] = {}
        self.kv_store: dict[tuple[int, int], int] = {}
        self.keys: dict[str, list[int]] = {}
        self.history: list[SchedulerOutput] = []
        # What the scenario exercised.
        self.num_oversized_steps = 0
        self.num_steps_with_blocked_media = 0  # work ran while a running chunk awaited rows
        self.num_readmissions = 0
        self.num_hit_tokens = 0
        self.num_shared_blocks = 0  # summed over steps

    # -- driving -------------------------------------------------------------------------

    def add(self, spec: DecodeSpec, *, at_step: int = 0, media_delay: int = 0) -> None:
        self.arrivals.append(Arrival(at_step, spec, media_delay))

    def request(self, request_id: str) -> RequestState:
        return self.requests[request_id]

    def run(self, max_steps: int) -> None:
        while self.arrivals or self.scheduler.has_work():
            assert self.step_index < max_steps, (
                f"not finished after {max_steps} steps: running "
                f"{[r.request_id for r in self.scheduler.running]}, waiting "
                f"{[r.request_id for r in self.scheduler.waiting]}"
            )
            self.step()
        self.check_all_finished()

    def step(self) -> SchedulerOutput:
        scheduler = self.scheduler
        for arrival in [a for a in self.arrivals if a.step <= self.step_index]:
            self.arrivals.remove(arrival)
            request = RequestState(arrival.spec, asyncio.Queue(), generator=None)
            self.requests[request.request_id] = request
            self.delay[request.request_id] = arrival.media_delay
            self.fetches[request.request_id] = {}
            scheduler.add(request)
        # Engine: Prefetcher.refresh for every request.
        for request in [*scheduler.running, *scheduler.waiting]:
            request.ready_chunks = {
                chunk
                for chunk, started in self.fetches[request.request_id].items()
                if self.step_index - started >= self.delay[request.request_id]
            }
        running_before = list(scheduler.running)
        waiting_before = list(scheduler.waiting)
        decoding_before = [r for r in scheduler.running if r.is_decoding]
        outputs_before = {r.request_id: list(r.output_token_ids) for r in self.requests.values()}

        output = scheduler.schedule()
        self.history.append(output)
        self.check_output(output, running_before, waiting_before, decoding_before, outputs_before)

        # Engine: drop the fetches of preempted requests, plan fetches for running ones.
        for request_id in output.preempted:
            self.fetches[request_id].clear()
            self.admitted_at.pop(request_id, None)
        for request_id in output.admitted:
            self.admitted_at[request_id] = self.step_index
        for request in scheduler.running:
            self.plan(request)
        for chunk in output.chunks:
            self.forward(chunk)
        self.postprocess(output)
        self.check_blocks()
        self.step_index += 1
        return output

    def plan(self, request: RequestState) -> None:
        position = request.num_computed_tokens
        while position < request.num_prompt_tokens:
            chunk = request.next_chunk(position)
            assert chunk is not None
            if request.chunk_needs_rows(*chunk):
                self.fetches[request.request_id].setdefault(chunk, self.step_index)
            position = chunk[1]

    def expected_keys(self, request: RequestState) -> list[int]:
        """Key of position p = what its K/V depend on: the key of p - 1, the token at p,
        and which row of which item sits at p."""
        keys = self.keys.setdefault(request.request_id, [])
        for position in range(len(keys), request.num_tokens):
            rows = tuple(
                (r.content_hash, position - r.offset)
                for r in request.spec.ranges
                if r.offset <= position < r.end
            )
            previous = keys[-1] if keys else 0
            keys.append(hash((previous, request.token_at(position), rows)))
        return keys

    def forward(self, work: ScheduledChunk) -> None:
        request = self.requests[work.request_id]
        assert work.token_ids == tuple(request.token_at(p) for p in range(work.start, work.end))
        assert work.num_prompt_tokens == request.num_prompt_tokens
        assert work.items == tuple(request.spec.ranges)
        keys = self.expected_keys(request)
        size = self.kv.block_size
        for position in range(work.start):
            slot = (work.block_table[position // size], position % size)
            assert self.kv_store.get(slot) == keys[position], (
                f"{request.request_id} reads wrong K/V at position {position} (step "
                f"{self.step_index}, computed from {work.start})"
            )
        for position in range(work.start, work.end):
            block = self.kv._blocks[work.block_table[position // size]]
            assert block.ref_count == 1, f"{request.request_id} writes a shared block"
            assert block.block_hash is None, f"{request.request_id} overwrites a cached block"
            self.kv_store[(block.block_id, position % size)] = keys[position]

    def postprocess(self, output: SchedulerOutput) -> None:
        """What the engine does after the forward: the scheduler's own bookkeeping, then a
        token for each request at its last position (a fake sampler), finishing a request
        after `max_tokens` via `scheduler.remove`."""
        update = self.scheduler.update_from_output(output)
        assert not update.failed
        assert [r.request_id for r in update.advanced] == [c.request_id for c in output.chunks]
        assert [r.request_id for r in update.sampling] == [
            c.request_id for c in output.chunks if c.samples
        ]
        for chunk in output.chunks:
            request = self.requests[chunk.request_id]
            assert request.num_computed_tokens == chunk.end
            self.fetches[request.request_id].pop((chunk.start, chunk.end), None)
        for request in update.sampling:
            request.output_token_ids.append(
                fake_token([request.token_at(p) for p in range(request.num_computed_tokens)])
            )
            if len(request.output_token_ids) >= request.spec.sampling.max_tokens:
                request.finished = True
                self.scheduler.remove(request)
                self.fetches[request.request_id].clear()
                self.finished_at[request.request_id] = self.step_index

    # -- invariants ----------------------------------------------------------------------

    def check_output(
        self,
        output: SchedulerOutput,
        running_before: list[RequestState],
        waiting_before: list[RequestState],
        decoding_before: list[RequestState],
        outputs_before: dict[str, list[int]],
    ) -> None:
        scheduler, kv = self.scheduler, self.kv
        step = self.step_index
        budget = scheduler.max_num_batched_tokens
        assert output.budget == budget - output.num_tokens  # what is left of the budget
        assert output.num_tokens <= budget or len(output.chunks) == 1, (
            f"step {step}: {output.num_tokens} tokens over a budget of {budget} in "
            f"{len(output.chunks)} chunks"
        )
        self.num_oversized_steps += output.num_tokens > budget
        assert len(scheduler.running) <= scheduler.max_num_seqs

        requests = self.requests
        scheduled = [requests[chunk.request_id] for chunk in output.chunks]
        preempted = [requests[i] for i in output.preempted]
        admitted = [requests[i] for i in output.admitted]
        assert len(set(scheduled)) == len(scheduled), "a request runs twice in one step"
        # Admission: oldest first, nobody overtakes the head; a request admitted this step
        # may be preempted again in the same step (then it is not in `admitted`).
        admitted_all = [r for r in waiting_before if r in admitted or r in preempted]
        assert admitted_all == waiting_before[: len(admitted_all)], f"step {step}: admission"
        # Priority: decodes in running order, then prefill chunks closest to their first
        # token first (those past the age bound before all others, oldest first).
        decodes = [r for r in scheduled if r in decoding_before]
        prefills = [r for r in scheduled if r not in decoding_before]
        assert scheduled == decodes + prefills, f"step {step}: decodes first"
        assert decodes == [r for r in decoding_before if r in decodes]
        assert len(prefills) <= scheduler.max_prefills_per_step
        # The first prefill chunk always runs; all of them together fit the prefill budget.
        sizes = [c.num_tokens for c in output.chunks if requests[c.request_id] in prefills]
        assert len(sizes) <= 1 or sum(sizes) <= scheduler.max_prefill_tokens_per_step, sizes
        order = self.prefill_order([*running_before, *admitted_all], decoding_before, step)
        assert prefills == [r for r in order if r in prefills], f"step {step}: prefill order"
        for chunk in output.chunks:
            request = requests[chunk.request_id]
            assert request in scheduler.running
            assert chunk.start == request.num_computed_tokens
            assert chunk.end == min(chunk.start + request.spec.max_chunk_tokens, request.num_tokens)
            assert chunk.samples == (chunk.end == request.num_tokens)
            assert chunk.block_table == tuple(kv.block_table(request.request_id))
            assert len(chunk.block_table) >= kv.blocks_for(chunk.end)
            if request.chunk_needs_rows(chunk.start, chunk.end):
                started = self.fetches[request.request_id].get((chunk.start, chunk.end))
                assert started is not None, f"step {step}: a media chunk ran, never fetched"
                assert step - started >= self.delay[request.request_id], (
                    f"step {step}: a media chunk ran before its rows arrived"
                )
                assert (chunk.start, chunk.end) in request.ready_chunks

        # Decodes are never starved: each running decode runs unless preempted.
        for request in decoding_before:
            assert request in scheduled or request in preempted, (
                f"step {step}: decoding {request.request_id} skipped"
            )

        # The first ready prefill in priority order gets its chunk whenever the budget
        # holds it beside every decode (it may only lose it to preemption).
        ready = [
            r
            for r in order
            if not self.awaits_rows(r) and r not in preempted and r in scheduler.running
        ]
        if ready and not preempted and len(decodes) + ready[0].spec.max_chunk_tokens <= budget:
            assert ready[0] in scheduled, f"step {step}: {ready[0].request_id} skipped"

        # Preemption takes the newest running requests and keeps their output.
        running_all = [*running_before, *admitted_all]
        if preempted:
            newest = running_all[len(running_all) - len(preempted) :]
            assert set(preempted) == set(newest), "preempted an older request"
        kept = [r for r in running_before if r not in preempted]
        assert scheduler.running == [*kept, *admitted]
        # Preempted requests go back to the head of the queue, in their running order.
        requeued = [r for r in running_all if r in preempted]
        assert list(scheduler.waiting) == [*requeued, *waiting_before[len(admitted_all) :]]
        for request in preempted:
            assert request.num_computed_tokens == 0
            assert not request.ready_chunks, "rows of a preempted request kept"
            assert request.output_token_ids == outputs_before[request.request_id]
            assert request.stats.num_preemptions >= 1
            assert request in scheduler.waiting
            assert request not in scheduled
            assert kv.block_table(request.request_id) == []

        # Admitted requests hold the blocks of their first chunk; computation resumes at
        # a whole number of cached blocks.
        for request in admitted:
            computed = request.num_computed_tokens
            assert computed % kv.block_size == 0
            assert computed < request.num_tokens, "admitted with nothing left to compute"
            first = request.next_chunk()
            assert len(kv.block_table(request.request_id)) >= kv.blocks_for(first[1])
            if not kv.enable_prefix_caching:
                assert computed == 0
            self.num_hit_tokens += computed
            self.num_readmissions += request.stats.num_preemptions > 0

        # Work conserving: an idle step has a reason.
        if not output.chunks and not output.preempted:
            for request in scheduler.running:
                chunk = request.next_chunk()
                assert chunk is not None and request.chunk_needs_rows(*chunk)
                assert chunk not in request.ready_chunks, f"step {step}: idle with ready work"
            assert scheduler.running or not scheduler.waiting, f"step {step}: idle, nobody in"
        if output.chunks and any(self.awaits_rows(r) for r in scheduler.running):
            self.num_steps_with_blocked_media += 1

    def prefill_order(
        self, running: list[RequestState], decoding: list[RequestState], step: int
    ) -> list[RequestState]:
        """The policy, written again: least remaining prefill first, ties older first;
        requests admitted more than the age bound ago before all others, oldest first."""
        bound = self.scheduler.max_prefill_age_steps

        def key(request: RequestState) -> tuple[int, int, int]:
            age = step - self.admitted_at.get(request.request_id, step)
            if age > bound:
                return (0, -age, 0)
            return (1, request.num_tokens - request.num_computed_tokens, -age)

        prefilling = [r for r in running if r not in decoding]
        return sorted(prefilling, key=key)

    @staticmethod
    def awaits_rows(request: RequestState) -> bool:
        chunk = request.next_chunk()
        return (
            chunk is not None
            and request.chunk_needs_rows(*chunk)
            and chunk not in request.ready_chunks
        )

    def check_blocks(self) -> None:
        """Reference counts equal the number of running tables holding each block; a block
        is in two tables only as a cached prefix block of both; waiting requests hold
        nothing; the free list is exactly the unreferenced blocks."""
        kv, scheduler = self.kv, self.scheduler
        holders: dict[int, list[tuple[RequestState, int]]] = {}
        for request in scheduler.running:
            table = kv.block_table(request.request_id)
            assert len(set(table)) == len(table)
            assert len(table) >= kv.blocks_for(request.num_computed_tokens)
            for index, block_id in enumerate(table):
                holders.setdefault(block_id, []).append((request, index))
        assert set(kv._tables) == {r.request_id for r in scheduler.running}
        for block in kv._blocks:
            held = holders.get(block.block_id, [])
            assert block.ref_count == len(held)
            assert (block.block_id in kv._free) == (block.ref_count == 0)
            if len(held) > 1:
                self.num_shared_blocks += 1
                assert block.block_hash is not None, "an uncached block is shared"
                for request, index in held:
                    assert (index + 1) * kv.block_size <= request.num_computed_tokens
                    assert request.block_hashes[index] == block.block_hash
            if block.block_hash is not None:
                assert kv._cached[block.block_hash] == block.block_id

    def check_all_finished(self) -> None:
        kv = self.kv
        assert not self.scheduler.running and not self.scheduler.waiting
        for request_id, request in self.requests.items():
            assert request_id in self.finished_at
            assert request.output_token_ids == reference_output(request.spec)
        assert kv.num_free_blocks == kv.num_blocks
        assert all(block.ref_count == 0 for block in kv._blocks)
        assert not kv._tables
        assert sum(r.stats.num_preemptions for r in self.requests.values()) == (
            self.scheduler.num_preemptions
        )


def serial_steps(arrivals: list[Arrival]) -> int:
    """Steps to run every request alone, one after another, with no cache: a bound that
    any sane schedule of the same requests stays well within."""
    total = max((a.step for a in arrivals), default=0)
    for a in arrivals:
        spec = a.spec
        num_chunks = -(-len(spec.prompt_token_ids) // spec.max_chunk_tokens)
        total += num_chunks * (a.media_delay + 1) + spec.sampling.max_tokens
    return total


# -- random scenarios ----------------------------------------------------------------------


def random_prompt(rng: random.Random, segments: list) -> tuple[list[int], tuple[MediaSource, ...]]:
    tokens: list[int] = []
    items = []
    for segment in segments:
        if segment[0] == "text":
            tokens += segment[1]
        else:
            _, content_hash, length = segment
            items.append(image(len(tokens), length, content_hash))
            tokens += [PLACEHOLDER] * length
    return tokens, tuple(items)


def random_segments(rng: random.Random, num_images: int, max_text: int) -> list:
    segments: list = [("text", [rng.randrange(10, 100) for _ in range(rng.randint(0, max_text))])]
    for _ in range(num_images):
        segments.append(("image", rng.choice(IMAGES), rng.randint(1, 20)))
        segments.append(("text", [rng.randrange(10, 100) for _ in range(rng.randint(0, max_text))]))
    return segments


FAMILIES = ("mixed", "small_cache", "media", "prefix", "tight_budget", "no_prefix_caching")


def random_scenario(seed: int, family: str) -> Simulator:
    rng = random.Random(f"{family}-{seed}")
    block_size = rng.choice([1, 2, 4, 8])
    max_num_seqs = rng.randint(1, 6)
    budget = rng.randint(max_num_seqs, 32)
    num_requests = rng.randint(1, 8)
    max_chunk = 20
    max_arrival = 12
    max_delay = 3
    image_probability = 0.4
    shared = [random_segments(rng, rng.randint(0, 1), 12) for _ in range(2)]
    if family == "small_cache":
        max_num_seqs = rng.randint(3, 6)
        num_requests = rng.randint(3, 6)
        max_chunk = 6
        budget = rng.randint(max(max_num_seqs, 2 * max_chunk), 32)
        max_arrival = 0
    elif family == "media":
        image_probability = 1.0
        max_delay = 6
        max_arrival = 3
        max_num_seqs = rng.randint(2, 6)
        budget = rng.randint(max_num_seqs, 32)
    elif family == "prefix":
        max_arrival = 40
        block_size = rng.choice([1, 2, 4])
    elif family == "tight_budget":
        budget = rng.randint(1, 4)
        max_num_seqs = rng.randint(1, budget)
        max_chunk = 12

    arrivals = []
    for index in range(num_requests):
        segments: list = []
        if family == "prefix" or rng.random() < 0.5:
            segments += rng.choice(shared)
        if family == "small_cache":
            segments += random_segments(rng, rng.random() < image_probability, 20)
            segments.append(("text", [rng.randrange(10, 100) for _ in range(15)]))
        elif family != "prefix" or rng.random() < 0.5:
            segments += random_segments(rng, rng.random() < image_probability, 20)
        tokens, items = random_prompt(rng, segments)
        if not tokens:
            tokens = [rng.randrange(10, 100)]
        spec = make_spec(
            f"r{index}",
            tokens,
            max_tokens=rng.randint(3, 10) if family == "small_cache" else rng.randint(1, 8),
            chunk=rng.randint(1, max_chunk),
            items=items,
            salt=rng.choice(["", "", "", "tenant"]),
        )
        arrivals.append(Arrival(rng.randint(0, max_arrival), spec, rng.randint(0, max_delay)))

    # Like `spec.check_fits`: every request fits in the whole cache on its own.
    need = max(
        -(-(len(a.spec.prompt_token_ids) + a.spec.sampling.max_tokens) // block_size)
        for a in arrivals
    )
    if family == "small_cache":
        num_blocks = need + rng.randint(0, 2)
    elif family == "prefix":
        num_blocks = need * num_requests + 4
    else:
        num_blocks = rng.randint(need, need * num_requests + 4)
    # Drawn apart, so the scenarios above stay what they were.
    knobs = random.Random(f"knobs-{family}-{seed}")
    sim = Simulator(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        budget=budget,
        prefix_caching=family != "no_prefix_caching",
        # small_cache must preempt in every scenario, which a prefill limit per step can avoid.
        max_prefills_per_step=(
            UNLIMITED if family == "small_cache" else knobs.choice([1, 2, UNLIMITED])
        ),
        max_prefill_age_steps=knobs.choice([0, 3, 64]),
        max_prefill_tokens_per_step=(
            UNLIMITED if family == "small_cache" else knobs.choice([1, 8, 24, UNLIMITED])
        ),
    )
    for arrival in arrivals:
        sim.add(arrival.spec, at_step=arrival.step, media_delay=arrival.media_delay)
    return sim


SEEDS_PER_FAMILY = 100


@pytest.mark.parametrize("family", FAMILIES)
def test_random_scenarios(family):
    """Every invariant above holds at every step of many seeded scenarios, and every
    request finishes with the output it would have had alone, within twice the steps of
    running all requests one after another."""
    totals: Counter[str] = Counter()
    for seed in range(SEEDS_PER_FAMILY):
        sim = random_scenario(seed, family)
        bound = 2 * serial_steps(sim.arrivals) + 10
        try:
            sim.run(max_steps=bound)
        except AssertionError as error:
            raise AssertionError(f"{family} seed {seed}: {error}") from error
        totals["preemptions"] += sim.scheduler.num_preemptions
        totals["scenarios_with_preemption"] += sim.scheduler.num_preemptions > 0
        totals["readmissions"] += sim.num_readmissions
        totals["hit_tokens"] += sim.num_hit_tokens
        totals["oversized_steps"] += sim.num_oversized_steps
        totals["blocked_media_steps"] += sim.num_steps_with_blocked_media
        totals["shared_blocks"] += sim.num_shared_blocks
    # The scenarios of each family exercise what the family is for.
    expected = {
        "mixed": ["preemptions", "hit_tokens", "blocked_media_steps", "shared_blocks"],
        "small_cache": ["readmissions"],
        "media": ["blocked_media_steps"],
        "prefix": ["hit_tokens", "shared_blocks"],
        "tight_budget": ["oversized_steps"],
        "no_prefix_caching": ["preemptions"],
    }[family]
    for name in expected:
        assert totals[name] > 0, (name, dict(totals))
    if family == "small_cache":
        assert totals["scenarios_with_preemption"] == SEEDS_PER_FAMILY, dict(totals)
    if family == "no_prefix_caching":
        assert totals["hit_tokens"] == 0


# -- targeted scenarios --------------------------------------------------------------------


def text(n: int, start: int = 10) -> list[int]:
    return list(range(start, start + n))


def big_sim(**overrides) -> Simulator:
    settings = dict(num_blocks=64, block_size=4, max_num_seqs=4, budget=16)
    settings.update(overrides)
    return Simulator(**settings)


def work_of(output: SchedulerOutput) -> dict[str, tuple[int, int]]:
    return {c.request_id: (c.start, c.end) for c in output.chunks}


def test_decodes_run_first_and_a_long_prompt_fills_the_rest():
    sim = big_sim(budget=10)
    sim.add(make_spec("short", text(3), max_tokens=6, chunk=8))
    sim.add(make_spec("long", text(40, 100), max_tokens=1, chunk=8))
    first = sim.step()
    assert work_of(first) == {"short": (0, 3)}  # 8 more would exceed 10 - 3
    assert first.admitted == ("short", "long")
    for expected_long_start in (0, 8, 16, 24):
        output = sim.step()
        assert output.chunks[0].request_id == "short"  # the decode first
        assert work_of(output)["short"][1] - work_of(output)["short"][0] == 1
        assert work_of(output)["long"] == (expected_long_start, expected_long_start + 8)
    sim.run(max_steps=20)


def test_a_chunk_that_does_not_fit_the_rest_of_the_budget_waits_whole():
    """Budget 8, chunk 8: while another request decodes, the prompt gets no smaller
    piece; it runs whole once the decode is done."""
    sim = big_sim(budget=8)
    sim.add(make_spec("decoder", text(2), max_tokens=4, chunk=8))
    sim.add(make_spec("prompt", text(20, 100), max_tokens=1, chunk=8), at_step=1)
    outputs = [sim.step() for _ in range(4)]
    assert [work_of(o) for o in outputs] == [
        {"decoder": (0, 2)},
        {"decoder": (2, 3)},
        {"decoder": (3, 4)},
        {"decoder": (4, 5)},  # samples the 4th and last token
    ]
    assert "decoder" in sim.finished_at
    assert work_of(sim.step()) == {"prompt": (0, 8)}
    assert work_of(sim.step()) == {"prompt": (8, 16)}
    sim.run(max_steps=10)


def long_prompt_among_short_arrivals(max_prefill_age_steps: int) -> list[int | None]:
    """A long prompt admitted at step 1 while a short request arrives every step; with
    room for one chunk beside every other request's decode (budget = chunk +
    max_num_seqs - 1). Returns, per step from 1 on, where its chunk started (None: none)."""
    sim = big_sim(num_blocks=200, budget=8 + 3, max_num_seqs=4)
    sim.scheduler.max_prefill_age_steps = max_prefill_age_steps
    sim.add(make_spec("warm", text(2), max_tokens=3, chunk=8))
    sim.add(make_spec("long", text(40, 100), max_tokens=1, chunk=8), at_step=1)
    for index in range(30):
        sim.add(
            make_spec(f"s{index}", text(2, 300 + index), max_tokens=4, chunk=8), at_step=1 + index
        )
    sim.step()
    starts = []
    while "long" not in sim.finished_at and sim.step_index < 40:
        starts.append(work_of(sim.step()).get("long", (None,))[0])
    sim.run(max_steps=80)
    return starts


def test_the_age_bound_keeps_a_long_prompt_from_starving():
    """Short prompts have less left, so they go first and crowd out the long one; once
    it has run longer than the age bound it goes first and gets a chunk every step."""
    starts = long_prompt_among_short_arrivals(max_prefill_age_steps=3)
    assert [s for s in starts if s is not None] == [0, 8, 16, 24, 32]
    assert None in starts, starts  # crowded out while young
    # Admitted at step 1 (starts[0]), it is older than 3 steps from step 5 (starts[4]) on.
    assert None not in starts[4:], starts  # then a chunk every step
    # Without the bound it only gets the steps the short prompts leave free: one in four.
    unbounded = long_prompt_among_short_arrivals(max_prefill_age_steps=1000)
    assert [s for s in unbounded if s is not None] == [0, 8, 16, 24, 32]
    assert len(unbounded) > 2 * len(starts), (starts, unbounded)


def test_a_burst_of_prompts_finishes_one_after_another_shortest_first():
    """One prefill per step: prompts that arrive together get their first tokens in
    turn, the one with least to compute first, not all together at the end."""
    sim = big_sim(budget=64, max_prefills_per_step=1)
    for name, length in [("long", 24), ("short", 8), ("middle", 16)]:
        sim.add(make_spec(name, text(length, 10 * length), max_tokens=2, chunk=8))
    first_token_at = {}
    while len(first_token_at) < 3:
        output = sim.step()
        assert len([c for c in output.chunks if c.start < c.num_prompt_tokens]) <= 1
        for chunk in output.chunks:
            if chunk.samples and chunk.request_id not in first_token_at:
                first_token_at[chunk.request_id] = sim.step_index - 1
    assert first_token_at == {"short": 0, "middle": 2, "long": 5}
    sim.run(max_steps=20)


def test_the_prefill_token_budget_packs_small_chunks_and_runs_a_large_one_alone():
    """16 prefill tokens per step: two prompts' chunks of 8 share a step (the one with less
    left first), a chunk of 20 runs as the step's only prefill, and a decode never counts
    against the prefill budget."""
    sim = big_sim(budget=64, max_prefill_tokens_per_step=16)
    sim.add(make_spec("a", text(24), max_tokens=3, chunk=8))
    sim.add(make_spec("b", text(16, 100), max_tokens=3, chunk=8))
    sim.add(make_spec("c", text(12, 200), max_tokens=3, chunk=8))
    assert work_of(sim.step()) == {"c": (0, 8), "b": (0, 8)}
    assert work_of(sim.step()) == {"c": (8, 12), "b": (8, 16)}  # 12 tokens: `a` does not fit
    assert work_of(sim.step()) == {"c": (12, 13), "b": (16, 17), "a": (0, 8)}
    assert work_of(sim.step()) == {"c": (13, 14), "b": (17, 18), "a": (8, 16)}
    sim.run(max_steps=20)
    big = big_sim(budget=64, max_prefill_tokens_per_step=16)
    big.add(make_spec("big", text(40), max_tokens=2, chunk=20))
    big.add(make_spec("small", text(50, 300), max_tokens=2, chunk=8))
    assert work_of(big.step()) == {"big": (0, 20)}  # less left: first, alone over the budget
    assert work_of(big.step()) == {"big": (20, 40)}  # still less left than `small`'s 50
    assert work_of(big.step()) == {"big": (40, 41), "small": (0, 8)}
    big.run(max_steps=20)


def test_a_chunk_larger_than_the_budget_runs_alone():
    sim = big_sim(budget=4, max_num_seqs=2)
    sim.add(make_spec("big", text(10), max_tokens=2, chunk=10))
    sim.add(make_spec("small", text(3, 50), max_tokens=3, chunk=2))
    # `small` has less left: it goes first, and `big` cannot fit beside it.
    assert work_of(sim.step()) == {"small": (0, 2)}
    assert work_of(sim.step()) == {"small": (2, 3)}
    assert work_of(sim.step()) == {"small": (3, 4)}
    assert work_of(sim.step()) == {"small": (4, 5)}  # its last token
    output = sim.step()
    assert work_of(output) == {"big": (0, 10)}  # alone, over the budget
    assert output.num_tokens == 10
    sim.run(max_steps=20)


def test_media_chunk_waits_for_rows_while_text_and_other_requests_run():
    sim = big_sim(budget=32)
    item = image(8, 8)
    sim.add(make_spec("media", text(24), items=(item,), max_tokens=2, chunk=8), media_delay=NEVER)
    sim.add(make_spec("text", text(5, 200), max_tokens=6, chunk=8))
    assert work_of(sim.step()) == {"media": (0, 8), "text": (0, 5)}  # [0, 8) needs no rows
    for _ in range(5):
        work = work_of(sim.step())
        assert "media" not in work  # [8, 16) waits for its rows
        assert "text" in work
    assert sim.request("media").num_computed_tokens == 8
    assert (8, 16) in sim.fetches["media"]  # the engine asked for them
    sim.delay["media"] = 0  # the rows arrive
    assert work_of(sim.step())["media"] == (8, 16)
    sim.run(max_steps=20)


def test_nothing_runs_while_every_pending_chunk_awaits_rows():
    sim = big_sim()
    sim.add(make_spec("media", text(12), items=(image(0, 12),), chunk=4), media_delay=3)
    outputs = [sim.step() for _ in range(3)]
    assert [o.chunks for o in outputs] == [(), (), ()]
    assert work_of(sim.step()) == {"media": (0, 4)}
    sim.run(max_steps=20)


def test_at_most_max_num_seqs_run_and_admission_is_oldest_first():
    sim = big_sim(max_num_seqs=2, budget=64)
    for index in range(5):
        sim.add(make_spec(f"r{index}", text(4, 10 * index + 10), max_tokens=2 + index))
    first = sim.step()
    assert first.admitted == ("r0", "r1")
    admitted = [i for o in [first, *(sim.step() for _ in range(30))] for i in o.admitted]
    assert admitted == ["r0", "r1", "r2", "r3", "r4"]
    assert not sim.scheduler.has_work()


def test_the_head_of_the_queue_is_not_overtaken():
    """The oldest waiting request does not fit the free blocks: a smaller one behind it
    waits too, instead of taking the blocks the head needs."""
    sim = big_sim(num_blocks=6, block_size=4, max_num_seqs=4, budget=64)
    sim.add(make_spec("holder", text(16), max_tokens=3, chunk=16))  # 4 blocks, 5 with output
    sim.add(make_spec("head", text(12, 100), max_tokens=1, chunk=12), at_step=1)  # 3 blocks
    sim.add(make_spec("small", text(2, 200), max_tokens=1, chunk=2), at_step=1)  # 1 block
    sim.step()
    while "holder" not in sim.finished_at:
        output = sim.step()
        assert not output.admitted
        assert [r.request_id for r in sim.scheduler.waiting] == ["head", "small"]
    output = sim.step()
    assert output.admitted == ("head", "small")
    sim.run(max_steps=10)


def test_preemption_takes_the_newest_keeps_its_output_and_recomputes_everything():
    sim = big_sim(num_blocks=6, block_size=2, max_num_seqs=2, budget=16, prefix_caching=False)
    sim.add(make_spec("old", text(5), max_tokens=6, chunk=4))  # up to 11 tokens: 6 blocks
    sim.add(make_spec("new", text(3, 100), max_tokens=6, chunk=4))  # up to 9 tokens: 5 blocks
    preempted_at = None
    while preempted_at is None:
        output = sim.step()
        assert "old" not in output.preempted
        if output.preempted:
            preempted_at = sim.step_index - 1
            assert output.preempted == ("new",)
            assert "new" not in work_of(output)
    new = sim.request("new")
    assert new.num_computed_tokens == 0
    assert new.output_token_ids, "preempted after it had sampled"
    kept = list(new.output_token_ids)
    assert new.stats.num_preemptions == 1
    assert sim.scheduler.waiting[0] is new
    sim.run(max_steps=60)
    assert new.output_token_ids[: len(kept)] == kept
    assert new.output_token_ids == reference_output(new.spec)
    # Once readmitted it recomputed prompt and output from position 0, chunk by chunk.
    recompute = [
        (w.start, w.end)
        for o in sim.history[preempted_at + 1 :]
        for w in o.chunks
        if w.request_id == "new" and w.start < len(kept) + 3 - 1
    ]
    assert recompute[0][0] == 0
    assert all(b - a <= 4 for a, b in recompute)


def test_a_request_alone_preempts_itself_only_when_nothing_else_is_left():
    """Two requests that each fit the cache alone but not together: the older always
    makes progress and both finish."""
    sim = big_sim(num_blocks=4, block_size=2, max_num_seqs=2, budget=8, prefix_caching=False)
    sim.add(make_spec("a", text(5), max_tokens=3, chunk=2))
    sim.add(make_spec("b", text(5, 100), max_tokens=3, chunk=2))
    sim.run(max_steps=40)
    assert sim.scheduler.num_preemptions > 0
    assert sim.request("a").stats.num_preemptions == 0
    assert sim.finished_at["a"] < sim.finished_at["b"]


def test_a_prefix_hit_skips_cached_blocks_but_computes_at_least_one_token():
    sim = big_sim(block_size=4)
    prompt = text(16)  # exactly four blocks
    sim.add(make_spec("first", prompt, max_tokens=2, chunk=8))
    sim.run(max_steps=10)
    sim.add(make_spec("same", prompt, max_tokens=2, chunk=8), at_step=sim.step_index)
    sim.add(make_spec("longer", [*prompt, 1, 2, 3], max_tokens=2, chunk=8), at_step=sim.step_index)
    output = sim.step()
    same, longer = sim.request("same"), sim.request("longer")
    # `same` may not hit its last block: the last prompt token's logits are needed.
    assert work_of(output) == {"same": (12, 16), "longer": (16, 19)}
    assert same.stats.num_cached_prompt_tokens == 12
    assert longer.stats.num_cached_prompt_tokens == 16
    sim.run(max_steps=10)
    assert same.output_token_ids == sim.request("first").output_token_ids


def test_prefix_cache_stats_count_each_admission_once_in_tokens():
    # Four blocks: `second` cannot be admitted until `first` is done, and waits steps.
    sim = big_sim(num_blocks=4, block_size=4, max_num_seqs=2, budget=16)
    prompt = text(12)
    sim.add(make_spec("first", prompt, max_tokens=4, chunk=16))
    sim.add(make_spec("second", prompt, max_tokens=4, chunk=16))
    sim.run(max_steps=30)
    stats = sim.kv.stats()
    second = sim.request("second")
    assert second.stats.num_cached_prompt_tokens == 8  # the last block is computed again
    assert stats.num_prefix_queries == 2  # however many steps `second` waited
    assert stats.num_prefix_query_tokens == 24  # every prompt token, as vLLM counts
    assert stats.num_prefix_hit_blocks * 4 == second.stats.num_cached_prompt_tokens


def test_another_salt_or_image_gets_no_prefix_hit():
    sim = big_sim(block_size=4)
    item = image(4, 8)
    prompt = text(16)
    sim.add(make_spec("first", prompt, items=(item,), max_tokens=1, chunk=16))
    sim.run(max_steps=10)
    now = sim.step_index
    sim.add(
        make_spec("salted", prompt, items=(item,), max_tokens=1, chunk=16, salt="x"), at_step=now
    )
    other = image(4, 8, IMAGES[1])
    sim.add(make_spec("other", prompt, items=(other,), max_tokens=1, chunk=16), at_step=now)
    sim.add(make_spec("same", prompt, items=(item,), max_tokens=1, chunk=16), at_step=now)
    sim.run(max_steps=20)
    assert sim.request("salted").stats.num_cached_prompt_tokens == 0
    assert sim.request("other").stats.num_cached_prompt_tokens == 4  # the text block
    assert sim.request("same").stats.num_cached_prompt_tokens == 12


def test_remove_forgets_waiting_and_running_requests():
    sim = big_sim(max_num_seqs=1)
    sim.add(make_spec("a", text(8), max_tokens=5))
    sim.add(make_spec("b", text(8, 50), max_tokens=5))
    sim.step()
    a, b = sim.request("a"), sim.request("b")
    assert sim.scheduler.running == [a] and list(sim.scheduler.waiting) == [b]
    sim.scheduler.remove(b)
    assert not sim.scheduler.waiting
    sim.scheduler.remove(a)
    assert not sim.scheduler.has_work()
    assert sim.kv.num_free_blocks == sim.kv.num_blocks
