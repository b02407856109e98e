"""`n` choices for one request: n generations of the same prompt. The first (the leader)
runs alone until it has produced its first token, so its prompt's KV blocks are in the
decoder's prefix cache; the other n-1 start then and share those blocks instead of
prefilling the prompt again. Ordered by events, not by time.

Choice i samples with seed + i when the request has a seed, so n=3 with a seed is
reproducible and its choices still differ from each other."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gateway.front import ChatRequest, GatewayFront, Outcome, Rejected
from gateway.pipeline import TextEvent
from tessera.v1 import common_pb2

MAX_CHOICES = 16
# n * max_tokens: what one request may make the decoders generate.
MAX_TOTAL_TOKENS = 1 << 16


def check_n(n: object, max_tokens: int) -> int:
    """`n` (null: 1), bounded by MAX_CHOICES and, with max_tokens, by MAX_TOTAL_TOKENS."""
    if n is None:
        return 1
    whole = isinstance(n, int) or (isinstance(n, float) and n.is_integer())
    if isinstance(n, bool) or not whole or not 1 <= n <= MAX_CHOICES:
        raise Rejected(f"n must be an integer in [1, {MAX_CHOICES}]", param="n")
    if max_tokens and int(n) > 1 and int(n) * max_tokens > MAX_TOTAL_TOKENS:
        raise Rejected(
            f"n * max_tokens must be at most {MAX_TOTAL_TOKENS}; ask for fewer choices or tokens",
            param="n",
        )
    return int(n)


def choice_requests(request: ChatRequest, n: int) -> list[ChatRequest]:
    """The request of each choice: the same, with seed + i when there is a seed."""
    requests = []
    for index in range(n):
        sampling = common_pb2.SamplingParams()
        sampling.CopyFrom(request.sampling)
        if request.sampling.HasField("seed"):
            sampling.seed = (request.sampling.seed + index) % 2**64
        requests.append(dataclasses.replace(request, sampling=sampling))
    return requests


@dataclass(frozen=True)
class ChoiceEvent:
    """Text of choice `index`, with the tokens it came from; `done` once it has ended."""

    index: int
    text: str = ""
    event: TextEvent | None = None
    done: bool = False


@dataclass(frozen=True)
class _Failed:
    error: BaseException


async def run_choices(
    front: GatewayFront, requests: list[ChatRequest], outcomes: list[Outcome]
) -> AsyncIterator[ChoiceEvent]:
    """Events of every choice as they come, interleaved. The first failure of any choice
    ends them all and is raised (before the leader's first token: before any event)."""
    queue: asyncio.Queue[ChoiceEvent | _Failed] = asyncio.Queue()
    leader_started = asyncio.Event()

    async def pump(index: int) -> None:
        try:
            async for text, event in front.generate(requests[index], outcomes[index]):
                await queue.put(ChoiceEvent(index, text, event))
                if index == 0:
                    leader_started.set()
            await queue.put(ChoiceEvent(index, done=True))
        except Exception as error:  # handed to the consumer, which raises it
            await queue.put(_Failed(error))
        finally:
            if index == 0:
                leader_started.set()

    async def followers() -> None:
        await leader_started.wait()
        tasks.extend(asyncio.create_task(pump(i)) for i in range(1, len(requests)))

    tasks = [asyncio.create_task(pump(0))]
    starter = asyncio.create_task(followers())
    try:
        remaining = len(requests)
        while remaining:
            item = await queue.get()
            if isinstance(item, _Failed):
                raise item.error
            remaining -= item.done
            yield item
    finally:
        for task in [starter, *tasks]:
            task.cancel()
        for task in [starter, *tasks]:
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass
class CollectedChoice:
    text: str
    outcome: Outcome


async def collect_choices(
    front: GatewayFront, requests: list[ChatRequest]
) -> list[CollectedChoice]:
    """Every choice's whole text and outcome."""
    outcomes = [Outcome() for _ in requests]
    texts = [""] * len(requests)
    async for item in run_choices(front, requests, outcomes):
        texts[item.index] += item.text
    return [CollectedChoice(t, o) for t, o in zip(texts, outcomes, strict=True)]
