"""Fetching embedding rows for the chunks ahead of each request, bounded in bytes.

As soon as a request runs, the rows of its next chunks are requested in the background,
so that when the scheduler reaches a chunk its rows are usually there already and the
forward does not wait. The bound counts rows requested and not yet consumed by a
forward, over all requests; a request's next chunk is always allowed, so the bound
cannot deadlock. Rows are dropped as soon as the chunk's forward has been built.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from decoder_service.embedding_client import EmbeddingClient, FetchedRows
from decoder_service.expedite import EncoderExpediter
from decoder_service.request import RequestState
from tessera.placeholders import slices_for_chunk


@dataclass(frozen=True)
class _PlannedFetch:
    num_bytes: int  # counted against max_bytes until the rows are taken or dropped
    content_hashes: frozenset[str]  # the items whose rows it fetches


class Prefetcher:
    def __init__(self, embeddings: EmbeddingClient, max_bytes: int, row_bytes: int):
        self.embeddings = embeddings
        self.expediter = EncoderExpediter(embeddings)
        self.max_bytes = max_bytes
        self.row_bytes = row_bytes
        self.num_pending_bytes = 0
        self._planned: dict[asyncio.Task, _PlannedFetch] = {}

    def plan(self, request: RequestState) -> None:
        """Starts fetches for the request's chunks ahead, while the bound allows."""
        position = request.num_computed_tokens
        first = True
        while position < request.num_prompt_tokens:
            chunk = request.next_chunk(position)
            assert chunk is not None
            slices = slices_for_chunk(request.spec.ranges, *chunk)
            if slices and chunk not in request.fetches:
                num_bytes = sum(s.num_rows for s in slices) * self.row_bytes
                if not first and self.num_pending_bytes + num_bytes > self.max_bytes:
                    return
                task = asyncio.create_task(
                    self.embeddings.fetch_chunk(request.request_id, request.spec.items, slices)
                )
                request.fetches[chunk] = task
                hashes = frozenset(s.content_hash for s in slices)
                self._planned[task] = _PlannedFetch(num_bytes, hashes)
                self.num_pending_bytes += num_bytes
            first = False
            position = chunk[1]

    def refresh(self, request: RequestState, now: float) -> BaseException | None:
        """Marks which pending chunks have their rows; returns a fetch's error, if any.
        Also accounts the time the request's next chunk has been waiting for rows."""
        request.ready_chunks = set()
        for chunk, task in request.fetches.items():
            if task.done():
                if task.cancelled():
                    return RuntimeError("an embedding fetch was cancelled")
                if task.exception() is not None:
                    return task.exception()
                request.ready_chunks.add(chunk)
                request.items_arrived |= self._items(task)
        chunk = request.next_chunk()
        blocked = (
            chunk is not None
            and request.chunk_needs_rows(*chunk)
            and chunk not in request.ready_chunks
        )
        if blocked and request.blocked_since is None:
            request.blocked_since = now
        elif not blocked and request.blocked_since is not None:
            request.stats.fetch_wait_seconds += now - request.blocked_since
            request.blocked_since = None
        return None

    def take(self, request: RequestState, start: int, end: int) -> list[FetchedRows]:
        """The rows of a scheduled chunk (which the scheduler saw ready)."""
        task = request.fetches.pop((start, end), None)
        if task is None:
            return []
        self._release(task)
        return task.result()

    def drop(self, request: RequestState) -> None:
        """Cancels and forgets every fetch of a request (finished or preempted)."""
        for task in request.fetches.values():
            task.cancel()
            # A fetch that failed before the cancel: its error no longer matters.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._release(task)
        request.fetches.clear()
        request.ready_chunks.clear()

    def pending_tasks(self, requests: list[RequestState]) -> list[asyncio.Task]:
        return [t for r in requests for t in r.fetches.values() if not t.done()]

    def items_all_arrived(self, requests: list[RequestState]) -> bool:
        """Whether every item that a fetch of `requests` still waits for has already
        arrived in another of their fetches, so no encoder is still computing one for
        them: what is left is transfer. An image split over three chunks is three
        fetches, which land a few milliseconds apart once its encode is done."""
        return not self._items_encoding(requests)

    def idle(self, requests: list[RequestState]) -> None:
        """The engine has nothing to run until rows arrive: the encoders still
        computing items for `requests` hear of it (decoder_service.expedite)."""
        encoding = self._items_encoding(requests)
        items = {item.range.content_hash: item for r in requests for item in r.spec.items}
        self.expediter.idle_for([items[content_hash] for content_hash in sorted(encoding)])

    def _items_encoding(self, requests: list[RequestState]) -> set[str]:
        """Items that fetches of `requests` wait for and none of their fetches has had
        (the rows of taken fetches included: `items_arrived`)."""
        fetches = [task for request in requests for task in request.fetches.values()]
        arrived = set().union(*(self._items(task) for task in fetches if task.done()))
        arrived = arrived.union(*(request.items_arrived for request in requests))
        waited = set().union(*(self._items(task) for task in fetches if not task.done()))
        return waited - arrived

    def _items(self, task: asyncio.Task) -> frozenset[str]:
        planned = self._planned.get(task)
        return planned.content_hashes if planned else frozenset()

    def _release(self, task: asyncio.Task) -> None:
        planned = self._planned.pop(task, None)
        if planned is not None:
            self.num_pending_bytes -= planned.num_bytes
