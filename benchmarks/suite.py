"""Running every arm over one workload, interleaved (A B C ... then B C ... A) in groups
of requests, and checking each arm's greedy tokens against generate()'s."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from benchmarks.common import Progress
from benchmarks.figures import ArmFigures, CellResult
from benchmarks.inprocess import HfGenerate, InProcessArm
from benchmarks.outcome import Outcome, check_tokens
from benchmarks.services import ServiceArm, ServiceCounters, peak_rss_mb, reset_peak_rss
from benchmarks.workloads import BenchRequest, Spec, realised_reuse, requests_for

Arm = InProcessArm | ServiceArm


class References:
    """generate()'s outcome per request content: taken from the hf-generate arm when it
    ran the request, computed (untimed) otherwise."""

    def __init__(self, hf: HfGenerate):
        self.hf = hf
        self.outcomes: dict[str, Outcome] = {}

    def record(self, request: BenchRequest, outcome: Outcome) -> None:
        self.outcomes[request.key] = outcome

    def get(self, request: BenchRequest) -> Outcome:
        if request.key not in self.outcomes:
            self.outcomes[request.key] = self.hf.run_one(request)
        return self.outcomes[request.key]


@dataclass(frozen=True)
class ModelShape:
    placeholder_token_id: int
    row_bytes: int  # float32 bytes of one embedding row, every plane
    # Image sides (min, max) in px of workloads that do not set their own.
    image_side: tuple[int, int]
    # Audio families: clip lengths (min, max) in s drawn instead of images.
    clip_seconds: tuple[float, float] | None = None


def _groups(requests: list[BenchRequest], size: int) -> list[list[BenchRequest]]:
    return [requests[i : i + size] for i in range(0, len(requests), size)]


def _rotated(arms: Sequence[Arm], turn: int) -> list[Arm]:
    turn %= len(arms)
    return [*arms[turn:], *arms[:turn]]


class CellRunner:
    def __init__(self, references: References, shape: ModelShape):
        self.references = references
        self.shape = shape
        self.prompt_lengths: dict[str, int] = {}
        self.num_checked = 0  # (request, arm) outputs compared with generate()'s
        self.num_cross_checked = 0  # ... compared only with the other arms' (all equal)

    def with_default_side(self, spec: Spec) -> Spec:
        """The spec with the run's item sizes where it sets none (clips for audio)."""
        if self.shape.clip_seconds and not spec.clip_seconds:
            spec = replace(spec, clip_seconds=self.shape.clip_seconds)
        return spec if spec.image_side else replace(spec, image_side=self.shape.image_side)

    def warm_up(self, arms: Sequence[Arm]) -> None:
        """Two small requests through every arm, unmeasured: models loaded, channels
        open and caches touched before the first cell."""
        spec = Spec("warm-up", 2, 1, 0.0, output_tokens=(4, 4), seed=1)
        self.closed_loop("warm-up", spec, arms, 2)

    @staticmethod
    def _figures(arms: Sequence[Arm], requests: list[BenchRequest]) -> dict[str, ArmFigures]:
        unique = len({item for request in requests for item in request.items})
        return {arm.name: ArmFigures(arm.name, num_unique_items=unique) for arm in arms}

    def _start(self, arms: Sequence[Arm], requests: list[BenchRequest]):
        figures = self._figures(arms, requests)
        before: dict[str, ServiceCounters] = {}
        for arm in arms:
            if isinstance(arm, ServiceArm):
                arm.reset_peaks()
                before[arm.name] = arm.snapshot()
        return figures, before

    def _record(self, arm: Arm, figures: ArmFigures, group, outcomes, wall) -> None:
        figures.add(outcomes, wall)
        for request, outcome in zip(group, outcomes, strict=True):
            self.prompt_lengths[request.key] = len(outcome.prompt_token_ids)
            if isinstance(arm, HfGenerate):
                self.references.record(request, outcome)
            if outcome.embedding_bytes is not None:
                figures.add_bytes(
                    outcome.embedding_bytes,
                    outcome.minimum_embedding_bytes(
                        self.shape.placeholder_token_id, self.shape.row_bytes
                    ),
                )

    def _check(
        self, cell: str, arms, figures, group, outcomes_by_arm, first: int, verify_every: int
    ) -> None:
        """Every arm against generate(); with `verify_every` > 1 only every so many
        requests are run through generate(), the others must agree across arms (and are
        checked against generate() where they do not)."""
        for index, request in enumerate(group):
            mine = [outcomes_by_arm[arm.name][index] for arm in arms]
            agree = all(o.token_ids == mine[0].token_ids for o in mine)
            if agree and (first + index) % verify_every:
                self.num_cross_checked += len(arms)
                continue
            self.num_checked += len(arms)
            reference = self.references.get(request)
            for arm, outcome in zip(arms, mine, strict=True):
                if check_tokens(arm.name, f"{cell} request {request.key}", outcome, reference):
                    figures[arm.name].num_near_ties += 1

    def _finish(self, arms, figures, before, requests, spec, name, concurrency) -> CellResult:
        for arm in arms:
            if isinstance(arm, ServiceArm):
                delta = arm.since(before[arm.name])
                figure = figures[arm.name]
                figure.encoder_passes = delta.encoder_passes
                figure.forward_seconds = delta.forward_seconds
                figure.fetch_wait_seconds = delta.fetch_wait_seconds
                figure.peak_rss_mb = delta.peak_rss_mb
                for role, seconds in delta.cpu_seconds.items():
                    figure.add_cpu(role, seconds)
        return self._cell_result(figures, requests, spec, name, concurrency)

    def _cell_result(self, figures, requests, spec, name, concurrency) -> CellResult:
        for request in requests:  # the cell is checked: generate()'s logits are not needed
            reference = self.references.outcomes.get(request.key)
            if reference is not None:
                reference.logits = []
        return CellResult(
            name=name,
            description=spec.describe(),
            concurrency=concurrency,
            chunk_tokens=spec.chunk_tokens,
            realised_reuse=realised_reuse(requests),
            num_unique_items=len({i for r in requests for i in r.items}),
            mean_prompt_tokens=statistics.mean(self.prompt_lengths[r.key] for r in requests),
            arms=figures,
        )

    def _run_group(self, arm: Arm, group, concurrency, figures, arrivals=None):
        started_cpu = time.process_time()
        outcomes = self._run_arm(arm, group, concurrency, figures, arrivals)
        role = "process" if isinstance(arm, InProcessArm) else "client"
        figures[arm.name].add_cpu(role, time.process_time() - started_cpu)
        return outcomes

    def _run_arm(self, arm: Arm, group, concurrency, figures, arrivals):
        if isinstance(arm, InProcessArm):
            reset_peak_rss("self")
            outcomes, wall = arm.run(group, concurrency)
            figure = figures[arm.name]
            figure.peak_rss_mb["process"] = max(
                figure.peak_rss_mb.get("process", 0.0), peak_rss_mb("self")
            )
        elif arrivals is not None:
            outcomes, wall = arm.run_open_loop(group, arrivals)
        else:
            outcomes, wall = arm.run(group, concurrency)
        self._record(arm, figures[arm.name], group, outcomes, wall)
        return outcomes

    def closed_loop(
        self,
        name: str,
        spec: Spec,
        arms: Sequence[Arm],
        concurrency: int,
        group_size: int | None = None,
        verify_every: int = 1,
    ) -> CellResult:
        """Every arm over the workload's requests with `concurrency` clients; arms take
        turns group by group, in rotated order."""
        spec = self.with_default_side(spec)
        requests = requests_for(spec)
        groups = _groups(requests, group_size or max(concurrency, 4))
        progress = Progress(len(groups) * len(arms), name)
        figures, before = self._start(arms, requests)
        first = 0
        for turn, group in enumerate(groups):
            outcomes = {}
            for arm in _rotated(arms, turn):
                outcomes[arm.name] = self._run_group(arm, group, concurrency, figures)
                progress.advance()
            self._check(name, arms, figures, group, outcomes, first, verify_every)
            first += len(group)
        return self._finish(arms, figures, before, requests, spec, name, concurrency)

    def alternating(self, specs: Sequence[Spec], arms: Sequence[Arm]) -> list[CellResult]:
        """The specs' requests one at a time, taking turns spec by spec and, within each,
        arm by arm (rotated): A1 through every arm, B1, A2, B2, ... So a slow minute of a
        shared host falls on every spec alike, and a difference between specs (the TTFT
        of a 1536 px image over a 512 px one) is read from requests that ran side by
        side, not from one spec's window against another's. Only what the clients see
        is kept: the services' counters (forward time, CPU, peak memory) would cover
        every spec at once, so they stay unset."""
        specs = [self.with_default_side(spec) for spec in specs]
        requests = [requests_for(spec) for spec in specs]
        figures = [self._figures(arms, spec_requests) for spec_requests in requests]
        progress = Progress(sum(map(len, requests)) * len(arms), "alternating")
        for index in range(max(map(len, requests))):
            for spec, spec_requests, spec_figures in zip(specs, requests, figures, strict=True):
                if index >= len(spec_requests):
                    continue
                group, outcomes = spec_requests[index : index + 1], {}
                for arm in _rotated(arms, index):
                    outcomes[arm.name] = self._run_group(arm, group, 1, spec_figures)
                    progress.advance()
                self._check(spec.name, arms, spec_figures, group, outcomes, index, 1)
        return [
            self._cell_result(spec_figures, spec_requests, spec, spec.name, 1)
            for spec, spec_requests, spec_figures in zip(specs, requests, figures, strict=True)
        ]

    def open_loop(
        self, name: str, spec: Spec, arms: Sequence[ServiceArm], rate: float, segment: int
    ) -> CellResult:
        """Poisson arrivals at `rate` requests/s; the schedule is cut into segments of
        `segment` requests, and the arms take turns segment by segment."""
        spec = self.with_default_side(spec)
        requests = requests_for(spec)
        rng = random.Random(spec.seed)
        groups = _groups(requests, segment)
        progress = Progress(len(groups) * len(arms), name)
        figures, before = self._start(arms, requests)
        for turn, group in enumerate(groups):
            arrivals, now = [], 0.0
            for _ in group:
                arrivals.append(now)
                now += rng.expovariate(rate)
            outcomes = {}
            for arm in _rotated(arms, turn):
                outcomes[arm.name] = self._run_group(arm, group, 0, figures, arrivals)
                progress.advance()
            self._check(name, arms, figures, group, outcomes, 0, 1)
        return self._finish(arms, figures, before, requests, spec, name, f"Poisson {rate}/s")
