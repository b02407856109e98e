"""Chooses what each engine step runs. Works on request state only, never on tensors.

Per step, within a budget of `max_num_batched_tokens`: every running request that is
decoding gets its one token first, then prefilling requests get their next chunk, oldest
first, so a long prompt never stalls requests that are already decoding.

A prefill chunk is always `[n, min(n + max_chunk_tokens, prompt_len))`: if the rest of
the budget cannot hold it, the request waits for the next step instead of taking a
smaller piece. Fixed chunk boundaries let the engine fetch the next chunk's rows ahead
of time, exactly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from decoder_service.request import RequestState


@dataclass(frozen=True)
class ScheduledWork:
    """Compute positions `[start, end)` of `request` in this step."""

    request: RequestState
    start: int
    end: int

    @property
    def is_prefill(self) -> bool:
        return self.start < self.request.num_prompt_tokens

    @property
    def completes_prompt(self) -> bool:
        """After this work the next token can be sampled."""
        return self.end >= self.request.num_prompt_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    work: list[ScheduledWork]

    @property
    def num_tokens(self) -> int:
        return sum(item.end - item.start for item in self.work)


class Scheduler:
    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []

    def add(self, request: RequestState) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, request: RequestState) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def schedule(self) -> SchedulerOutput:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.popleft())
        budget = self.max_num_batched_tokens
        work: list[ScheduledWork] = []
        for request in self.running:
            if not request.is_prefilling and budget >= 1:
                position = request.num_computed_tokens
                work.append(ScheduledWork(request, position, position + 1))
                budget -= 1
        for request in self.running:
            if not request.is_prefilling:
                continue
            chunk = request.next_chunk(request.num_computed_tokens)
            assert chunk is not None
            size = chunk[1] - chunk[0]
            # The first piece of work always runs, so a budget smaller than a chunk
            # cannot starve a request.
            if size <= budget or not work:
                work.append(ScheduledWork(request, *chunk))
                budget -= size
        return SchedulerOutput(work)
