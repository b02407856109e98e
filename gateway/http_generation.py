"""Serving generations over HTTP for any endpoint shape (chat or completions): one JSON
response, or server-sent events interleaving every choice's chunks with their `index`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.choices import CollectedChoice, collect_choices, run_choices
from gateway.front import ChatRequest, GatewayFront, Outcome, Rejected
from gateway.pipeline import DownstreamError
from gateway.prompt import PromptError
from tessera.v1 import common_pb2

REQUEST_ID_HEADER = "X-Request-Id"


class Shape(Protocol):
    def response(self, choices: Sequence[CollectedChoice]) -> dict: ...

    def chunks(
        self,
        index: int,
        text: str | None,
        entries: Sequence[common_pb2.TokenLogprobs] = (),
        first: bool = False,
        finish_reason: str | None = None,
    ) -> list[dict]: ...

    def usage_chunk(self, outcomes: Sequence[Outcome]) -> dict: ...


# An error as the body of an event (after the first chunk there is no status to set).
ErrorBody = Callable[[Exception], dict]


async def complete(
    request: Request, front: GatewayFront, requests: list[ChatRequest], shape: Shape
) -> Response:
    task = asyncio.create_task(collect_choices(front, requests))
    # A client that hangs up stops its generations (and frees their KV blocks) at once.
    while not task.done():
        await asyncio.wait([task], timeout=0.1)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return Response(status_code=499)
    return JSONResponse(
        shape.response(task.result()), headers={REQUEST_ID_HEADER: requests[0].request_id}
    )


async def stream(
    front: GatewayFront,
    requests: list[ChatRequest],
    shape: Shape,
    include_usage: bool,
    error_body: ErrorBody,
) -> Response:
    """Errors before the first chunk are raised (a plain HTTP error); after it, an event."""
    events = _events(front, requests, shape, include_usage, error_body)
    first = await anext(events)
    return StreamingResponse(
        _prepend(first, events),
        media_type="text/event-stream",
        headers={REQUEST_ID_HEADER: requests[0].request_id},
    )


async def _events(
    front: GatewayFront,
    requests: list[ChatRequest],
    shape: Shape,
    include_usage: bool,
    error_body: ErrorBody,
) -> AsyncIterator[str]:
    outcomes = [Outcome() for _ in requests]
    started = [False] * len(requests)
    sent_any = False
    try:
        async for item in run_choices(front, requests, outcomes):
            first = not started[item.index]
            started[item.index] = True
            if item.done:
                reason = outcomes[item.index].finish_reason
                # With no text at all, the role still comes first.
                chunks = shape.chunks(item.index, None, first=first, finish_reason=reason)
            else:
                entries = item.event.tokens.logprobs if item.event else ()
                chunks = shape.chunks(item.index, item.text, entries, first=first)
            for payload in chunks:
                yield _sse(payload)
            sent_any = True
    except (Rejected, PromptError, DownstreamError) as error:
        if not sent_any:
            raise
        yield _sse({"error": error_body(error)})
        yield "data: [DONE]\n\n"
        return
    if include_usage:
        yield _sse(shape.usage_chunk(outcomes))
    yield "data: [DONE]\n\n"


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _prepend(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    yield first
    async for item in rest:
        yield item
