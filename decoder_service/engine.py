"""The decoder engine: `step()` = schedule -> fetch -> run -> postprocess, in a loop.

The loop lives on the event loop; the forward runs on one model thread, so fetches for
the next chunks (started as soon as a chunk is scheduled) proceed while it computes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import torch

from decoder_service.embedding_client import EmbeddingClient, FetchedRows
from decoder_service.model_runner import ModelRunner, WorkInput
from decoder_service.request import (
    ChunkRecord,
    DecodeSpec,
    Event,
    Finished,
    FinishReason,
    RequestState,
    SampledToken,
)
from decoder_service.sampler import sample
from decoder_service.scheduler import ScheduledWork, Scheduler
from tessera.adapters import ModelFamily
from tessera.placeholders import slices_for_chunk
from tessera.v1 import encoder_pb2, encoder_pb2_grpc

log = logging.getLogger("tessera.decoder")


class Engine:
    def __init__(
        self,
        family: ModelFamily,
        scheduler: Scheduler,
        embeddings: EmbeddingClient,
        max_model_len: int,
    ):
        self.family = family
        self.scheduler = scheduler
        self.embeddings = embeddings
        self.max_model_len = max_model_len
        self.runner = ModelRunner(family)
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._wakeup = asyncio.Event()
        self._requests: dict[str, RequestState] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run_forever(), name="engine-loop")

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    async def generate(self, spec: DecodeSpec) -> AsyncIterator[Event]:
        """Streams the request's sampled tokens, then `Finished`; an exception is raised.
        Leaving the iteration early (client gone) aborts the request."""
        if spec.request_id in self._requests:
            raise ValueError(f"request id {spec.request_id} is already running")
        generator = torch.Generator(device=self.family.device)
        if spec.sampling.seed is not None:
            generator.manual_seed(spec.sampling.seed)
        else:
            generator.seed()
        request = RequestState(spec, asyncio.Queue(), generator)
        self._requests[spec.request_id] = request
        self.scheduler.add(request)
        self._wakeup.set()
        try:
            while True:
                event = await request.events.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            if not request.finished:
                log.info("request %s aborted", spec.request_id)
                self._finish(request)

    async def _run_forever(self) -> None:
        while True:
            if not self.scheduler.has_work():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                await self.step()
            except Exception:  # a bug, not a request's fault: keep serving the others
                log.exception("engine step failed")
                for request in list(self._requests.values()):
                    self._fail(request, RuntimeError("internal error in the decoder engine"))

    async def step(self) -> None:
        output = self.scheduler.schedule()
        for work in output.work:
            # Started before this step's forward, so the fetch overlaps it.
            self._prefetch_next_chunk(work)
        inputs = []
        for work in output.work:
            rows = await self._rows_for(work)
            if rows is not None:
                inputs.append(WorkInput(work, rows))
        if not inputs:
            return
        loop = asyncio.get_running_loop()
        logits = await loop.run_in_executor(self._model_thread, self.runner.run, inputs)
        for item, request_logits in zip(inputs, logits, strict=True):
            self._postprocess(item.work, request_logits)

    # -- embeddings ----------------------------------------------------------------------

    async def _rows_for(self, work: ScheduledWork) -> list[FetchedRows] | None:
        """The rows this work needs, or None if the request failed meanwhile."""
        request = work.request
        if not work.is_prefill:
            return []
        task = request.prefetches.pop((work.start, work.end), None) or self._start_fetch(
            request, work.start, work.end
        )
        started = time.monotonic()
        try:
            rows = await task if task else []
        except Exception as error:
            self._fail(request, error)
            return None
        finally:
            request.stats.fetch_wait_seconds += time.monotonic() - started
        request.stats.chunks.append(
            ChunkRecord(
                work.start,
                work.end,
                sum(r.slice.num_rows for r in rows),
                sum(r.num_bytes for r in rows),
            )
        )
        request.stats.num_reencoded_items += sum(r.reencoded for r in rows)
        return rows

    def _start_fetch(self, request: RequestState, start: int, end: int) -> asyncio.Task | None:
        slices = slices_for_chunk(request.spec.ranges, start, end)
        if not slices:
            return None
        return asyncio.create_task(
            self.embeddings.fetch_chunk(request.request_id, request.spec.items, slices)
        )

    def _prefetch_next_chunk(self, work: ScheduledWork) -> None:
        request = work.request
        chunk = request.next_chunk(work.end) if work.is_prefill else None
        if chunk is None or chunk in request.prefetches or request.finished:
            return
        task = self._start_fetch(request, *chunk)
        if task is not None:
            request.prefetches[chunk] = task

    # -- postprocess ---------------------------------------------------------------------

    def _postprocess(self, work: ScheduledWork, logits: torch.Tensor | None) -> None:
        request = work.request
        if request.finished:
            return
        request.num_computed_tokens = work.end
        if logits is None:
            return
        if work.is_prefill:
            self._release_leases(request)
        token = sample(logits, request.spec.sampling, request.generator)
        request.output_token_ids.append(token.token_id)
        if request.stats.time_to_first_token_seconds is None:
            request.stats.time_to_first_token_seconds = time.monotonic() - request.arrival_time
        request.events.put_nowait(token)
        reason = self._finish_reason(request, token)
        if reason is not None:
            request.events.put_nowait(
                Finished(
                    reason, request.num_prompt_tokens, len(request.output_token_ids), request.stats
                )
            )
            self._finish(request)

    def _finish_reason(self, request: RequestState, token: SampledToken) -> FinishReason | None:
        options = request.spec.sampling
        if token.token_id in options.stop_token_ids or (
            not options.ignore_eos and token.token_id in self.family.eos_token_ids
        ):
            return FinishReason.STOP
        total = request.num_prompt_tokens + len(request.output_token_ids)
        if len(request.output_token_ids) >= options.max_tokens or total >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _fail(self, request: RequestState, error: BaseException) -> None:
        if not request.finished:
            request.events.put_nowait(error)
            self._finish(request)

    def _finish(self, request: RequestState) -> None:
        if request.finished:
            return
        request.finished = True
        self.scheduler.remove(request)
        self._requests.pop(request.request_id, None)
        for task in request.prefetches.values():
            task.cancel()
        request.prefetches.clear()
        request.kv_cache = None
        if request.is_prefilling:
            self._release_leases(request)

    def _release_leases(self, request: RequestState) -> None:
        """Tells each encoder the request no longer needs its items pinned: their
        positions are in the KV cache (or the request is gone)."""
        addresses = {a for item in request.spec.items for a in item.encoder_addresses}
        for address in addresses:
            task = asyncio.create_task(self._release_on(address, request.request_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _release_on(self, address: str, owner: str) -> None:
        stub = encoder_pb2_grpc.EncoderServiceStub(self.embeddings.channels.get(address))
        try:
            await stub.ReleaseLeases(encoder_pb2.ReleaseLeasesRequest(lease_owner=owner), timeout=5)
        except Exception as error:  # the lease runs out by itself
            log.debug("releasing leases on %s failed: %s", address, error)
