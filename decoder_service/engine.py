"""The decoder engine: `step()` = schedule -> gather rows -> run -> postprocess, in a loop.

The loop lives on the event loop; the forward runs on one model thread, so embedding
fetches for the chunks ahead proceed while it computes. When nothing can run because
every pending chunk waits for rows, the loop sleeps until a fetch lands; that time is
the forward's wait on embeddings, exported in stats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch

from decoder_service.embedding_client import EmbeddingClient
from decoder_service.grammar import GrammarCompiler, allowed_tokens_batch
from decoder_service.model_runner import ModelRunner, WorkInput
from decoder_service.prefetch import Prefetcher
from decoder_service.request import (
    ChunkRecord,
    DecodeSpec,
    Event,
    Finished,
    FinishReason,
    RequestState,
    SampledToken,
)
from decoder_service.sampler import SamplerRow, TokenCounts, needs_counts, sample_batch
from decoder_service.scheduler import ScheduledChunk, Scheduler
from tessera.adapters import ModelFamily
from tessera.compute_thread import compute_thread
from tessera.loop_guard import run_guarded
from tessera.thread_governor import ThreadGovernor
from tessera.v1 import encoder_pb2, encoder_pb2_grpc

log = logging.getLogger("tessera.decoder")


class RequestFailedError(RuntimeError):
    """One request failed inside the engine; the others in its step go on."""


class ShuttingDownError(RuntimeError):
    """The decoder is stopping and its drain time is up: retry elsewhere."""


@dataclass
class EngineCounters:
    num_steps: int = 0
    num_batched_tokens: int = 0
    num_scheduled_requests: int = 0
    forward_seconds: float = 0.0
    fetch_wait_seconds: float = 0.0  # no work could run: every pending chunk awaited rows
    num_finished: int = 0
    num_aborted: int = 0
    num_stalls: int = 0  # steps that could neither run nor wait (a bug: `_end_stall`)
    num_engine_errors: int = 0  # exceptions the loop caught (a bug: `_run_forever`)
    num_held_forwards: int = 0  # on one thread while local encoders computed our items


@dataclass(frozen=True)
class _StepResult:
    forward_seconds: float  # the forward alone, without the draw
    sampled: dict[str, SampledToken | Exception]  # request id -> its token (or its error)


class Engine:
    def __init__(
        self,
        family: ModelFamily,
        scheduler: Scheduler,
        runner: ModelRunner,
        prefetcher: Prefetcher,
        embeddings: EmbeddingClient,
        max_model_len: int,
        threads: ThreadGovernor | None = None,
        stream_interval: int = 1,
        hold_threads_while_encoding: bool = False,
    ):
        self.family = family
        self.scheduler = scheduler
        self.runner = runner
        self.prefetcher = prefetcher
        self.embeddings = embeddings
        self.max_model_len = max_model_len
        self.counters = EngineCounters()
        self.threads = threads  # sizes the compute thread's torch pool before each forward
        # The encoders share this host's CPUs (DecoderConfig.hold_threads_while_encoding).
        self.hold_threads_while_encoding = hold_threads_while_encoding
        # Tokens per message after the first (--stream-interval, >= 1): fewer, larger ones.
        self.stream_interval = stream_interval
        self.grammars = GrammarCompiler.for_family(family)
        # Forwards and sampling: every torch op of the decoder runs on this one thread.
        self._compute = compute_thread()
        self._wakeup = asyncio.Event()
        self._requests: dict[str, RequestState] = {}
        self._background: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._spawn(self._run_forever())

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    async def generate(self, spec: DecodeSpec) -> AsyncIterator[Event]:
        """Streams the request's sampled tokens, then `Finished`; errors are raised.
        Leaving the iteration early (client gone, deadline) aborts the request and frees
        its blocks and fetches at once."""
        async for events in self.stream(spec):
            for event in events:
                yield event

    async def stream(self, spec: DecodeSpec) -> AsyncIterator[list[Event]]:
        """`generate` in batches. The first token goes out alone, as soon as it is drawn;
        each later batch holds at least `stream_interval` tokens, or fewer ending with
        `Finished` or an error, plus every event already queued when the caller asks, so
        a caller slower than the steps (a client reading slowly) sends one message for
        several tokens instead of falling further behind.

        With --stream-interval 4, a request of 10 tokens streams [1], [2..5], [6..9],
        [10, Finished]: 4 messages instead of 11."""
        if spec.request_id in self._requests:
            raise ValueError(f"request id {spec.request_id} is already running")
        generator = torch.Generator(device=self.family.device)
        if spec.sampling.seed is not None:
            generator.manual_seed(spec.sampling.seed)
        else:
            generator.seed()
        request = RequestState(spec, asyncio.Queue(), generator)
        if spec.sampling.structured is not None:  # a bad grammar: ValueError, as bad input
            request.grammar = await asyncio.to_thread(
                self.grammars.matcher, spec.sampling.structured
            )
        self._requests[spec.request_id] = request
        self.scheduler.add(request)
        self._wakeup.set()
        try:
            min_tokens = 1  # the first token alone, as soon as it is drawn
            while True:
                events = await _next_events(request.events, min_tokens)
                min_tokens = self.stream_interval
                if isinstance(events[-1], BaseException):
                    if events[:-1]:  # the tokens before the error still go out
                        yield events[:-1]
                    raise events[-1]
                yield events
                if isinstance(events[-1], Finished):
                    return
        finally:
            if not request.finished:
                log.info("request %s aborted", spec.request_id)
                self.counters.num_aborted += 1
                self._finish(request)

    async def drain(self, seconds: float) -> None:
        """On shutdown: lets running requests finish for up to `seconds`, then ends the
        rest with ShuttingDownError (their callers get UNAVAILABLE and retry elsewhere)."""
        deadline = time.monotonic() + seconds
        while self._requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        error = ShuttingDownError("the decoder is shutting down; retry the request")
        for request in list(self._requests.values()):
            self._fail(request, error)

    async def _run_forever(self) -> None:
        """Steps while there is work and sleeps until a request arrives when there is
        none. Nothing raised in here may end the loop: every request, running and yet to
        come, would then hang until its deadline with no word in the log."""
        await run_guarded(self._run_once, self._recover_from_error)

    async def _run_once(self) -> None:
        if self.scheduler.has_work():
            await self.step()
            return
        self.prefetcher.expediter.not_idle()  # nothing waits for rows
        self._wakeup.clear()
        await self._wakeup.wait()
        if self.threads is not None:
            # What the host did while this engine had nothing to do is no guide to the
            # threads its next forwards will get (thread_governor).
            self.threads.restart()

    def _recover_from_error(self) -> None:
        """A bug, not a request's fault: fail the requests held, keep serving."""
        log.exception("the engine's loop failed (a bug); failing the requests it held")
        self.counters.num_engine_errors += 1
        for request in list(self._requests.values()):
            self._fail(request, RuntimeError("internal error in the decoder engine"))

    async def step(self) -> None:
        self._refresh_rows()
        output = self.scheduler.schedule()
        for request_id in output.preempted:
            self.prefetcher.drop(self._requests[request_id])
        for request in self.scheduler.running:
            self.prefetcher.plan(request)
        if not output.chunks:
            if output.preempted:
                # The step's only work was preempted (a preemption also holds back the
                # step's admissions and prefills): the freed blocks let the next step
                # run. Waiting for rows here waited for ever when none were in flight.
                await asyncio.sleep(0)
            elif pending := self.prefetcher.pending_tasks(self.scheduler.running):
                self.prefetcher.idle(self.scheduler.running)
                await self._wait_for_rows(pending)
            else:
                self._end_stall()
            return
        self.prefetcher.expediter.not_idle()
        held = self._hold_threads_while_encoding()
        inputs = [self._gather(chunk) for chunk in output.chunks]
        result = await self._compute.run(self._forward_and_sample, inputs)
        self.counters.forward_seconds += result.forward_seconds
        self.counters.num_held_forwards += held
        self.counters.num_steps += 1
        self.counters.num_batched_tokens += output.num_tokens
        self.counters.num_scheduled_requests += len(output.chunks)
        update = self.scheduler.update_from_output(output)
        for request, error in update.failed:  # bookkeeping of one request: it ends alone
            self._fail_after_forward(request, error)
        for request in update.advanced:
            if request.num_computed_tokens >= request.num_prompt_tokens:
                self._release_leases(request)
        for request in update.sampling:
            token = result.sampled.get(request.request_id)
            if token is None or request.finished:  # ended while its forward ran
                continue
            if isinstance(token, Exception):
                self._fail_after_forward(request, token)
                continue
            try:
                self._emit(request, token)
            except Exception as error:
                self._fail_after_forward(request, error)

    def _forward_and_sample(self, inputs: list[WorkInput]) -> _StepResult:
        """On the compute thread: the step's forward, then one draw over every chunk that
        samples, so the thread hands back to the event loop once per step rather than
        twice (each hand-back leaves the model idle until the loop gets to it). A request
        that ended while the forward ran is not drawn for; the caller emits only what
        `update_from_output` confirms."""
        if self.threads is not None:
            self.threads.adjust()
        started = time.monotonic()
        logits = self.runner.run(inputs)
        forward_seconds = time.monotonic() - started
        sampling = []
        for work, row in zip(inputs, logits, strict=True):
            request = self._requests.get(work.chunk.request_id)
            if row is not None and request is not None and not request.finished:
                sampling.append((request, row))
        sampled = self._sample_step(sampling) if sampling else []
        by_id = {r.request_id: t for (r, _), t in zip(sampling, sampled, strict=True)}
        return _StepResult(forward_seconds, by_id)

    # -- embeddings ----------------------------------------------------------------------

    def _refresh_rows(self) -> None:
        now = time.monotonic()
        for request in [*self.scheduler.running, *self.scheduler.waiting]:
            error = self.prefetcher.refresh(request, now)
            if error is not None:
                self._fail(request, error)

    def _end_stall(self) -> None:
        """Requests wait, yet the step has no chunk, preempted none and waits for no
        rows: nothing the engine awaits can change that, and waiting for the next
        request hung them until their deadlines (the preemption fixed in 5c37232 was
        such a case). A bug, in the scheduler or the prefetcher: the requests it holds
        fail with an error that says so (the running ones, whose blocks the waiting ones
        may need; else the waiting ones), and the engine keeps serving."""
        scheduler = self.scheduler
        stalled = list(scheduler.running) or list(scheduler.waiting)
        log.error(
            "engine stalled (a bug): %d running, %d waiting, no chunk and no rows in "
            "flight; failing %s",
            len(scheduler.running),
            len(scheduler.waiting),
            "; ".join(map(_stall_state, stalled)),
        )
        self.counters.num_stalls += 1
        error = RequestFailedError(
            "the decoder's scheduler could not advance this request (an internal error, "
            "logged); send it again"
        )
        for request in stalled:
            self._fail(request, error)

    async def _wait_for_rows(self, pending: list[asyncio.Task]) -> None:
        """Nothing can run: sleep until one of the `pending` fetches lands or a request
        arrives."""
        self._wakeup.clear()
        wakeup = asyncio.ensure_future(self._wakeup.wait())
        started = time.monotonic()
        try:
            done, _ = await asyncio.wait([*pending, wakeup], return_when=asyncio.FIRST_COMPLETED)
        finally:
            wakeup.cancel()
        self.counters.fetch_wait_seconds += time.monotonic() - started
        # While this engine waited, the host's busy CPUs were (on a shared host) its
        # encoder computing these rows, now done: no guide to the forwards that use
        # them. With an item still encoding the governor's window stands (a restart then
        # cost a busy cell 8-14%, docs/benchmarks.md).
        landed = not done.isdisjoint(pending)
        if (
            self.threads is not None
            and landed
            and self.prefetcher.items_all_arrived(self.scheduler.running)
        ):
            self.threads.restart()

    def _hold_threads_while_encoding(self) -> bool:
        """One torch thread while an encoder on this host computes items the running
        requests fetch: its threads start mid-forward, at moments the governor's window
        cannot foresee, and a two-thread forward then waits at every op (decode steps of
        87-128 ms against 10-11 on one thread, thread_governor). Whether it holds."""
        if self.threads is None or not self.hold_threads_while_encoding:
            return False
        encoding = not self.prefetcher.items_all_arrived(self.scheduler.running)
        self.threads.hold_one_thread(encoding)
        return encoding

    def _gather(self, chunk: ScheduledChunk) -> WorkInput:
        request = self._requests[chunk.request_id]
        rows = self.prefetcher.take(request, chunk.start, chunk.end)
        if chunk.start < request.num_prompt_tokens:
            request.stats.chunks.append(
                ChunkRecord(
                    chunk.start,
                    chunk.end,
                    sum(r.slice.num_rows for r in rows),
                    sum(r.num_bytes for r in rows),
                )
            )
            request.stats.num_reencoded_items += sum(r.reencoded for r in rows)
        return WorkInput(chunk, rows)

    # -- postprocess ---------------------------------------------------------------------

    def _sample_step(
        self, sampling: list[tuple[RequestState, torch.Tensor]]
    ) -> list[SampledToken | Exception]:
        """One `sample_batch` over every row that samples this step, on the compute
        thread. Should the batch fail, each row is sampled alone, so only the request at
        fault gets its exception."""
        try:
            masks = self._grammar_masks(sampling)
            rows = [
                self._sampler_row(request, logits, masks.get(request.request_id))
                for request, logits in sampling
            ]
            return sample_batch(torch.stack([logits for _, logits in sampling]), rows)
        except Exception:
            pass
        results: list[SampledToken | Exception] = []
        for request, logits in sampling:
            try:
                row = self._sampler_row(request, logits)
                results.append(sample_batch(logits.unsqueeze(0), [row])[0])
            except Exception as error:
                results.append(error)
        return results

    @staticmethod
    def _grammar_masks(
        sampling: list[tuple[RequestState, torch.Tensor]],
    ) -> dict[str, torch.Tensor]:
        """The allowed-token masks of every structured request of the step, filled in
        one parallel call; {} with fewer than two (each row then fills its own)."""
        structured = [(r, logits) for r, logits in sampling if r.grammar is not None]
        if len(structured) < 2:
            return {}
        vocab_size = structured[0][1].shape[-1]
        masks = allowed_tokens_batch([r.grammar for r, _ in structured], vocab_size)
        return {r.request_id: mask for (r, _), mask in zip(structured, masks, strict=True)}

    def _sampler_row(
        self, request: RequestState, logits: torch.Tensor, mask: torch.Tensor | None = None
    ) -> SamplerRow:
        options = request.spec.sampling
        if request.token_counts is None and needs_counts(options):
            # Sized like the logits: an lm_head may be padded past the tokenizer's vocabulary.
            request.token_counts = TokenCounts(
                logits.shape[-1], request.spec.prompt_token_ids, logits.device
            )
            for token_id in request.output_token_ids:
                request.token_counts.add(token_id)
        # vLLM: min_tokens holds back the stop ids, and EOS unless EOS does not stop.
        suppress = set(options.stop_token_ids)
        if not options.ignore_eos:
            suppress.update(self.family.eos_token_ids)
        return SamplerRow(
            options,
            request.generator,
            num_output_tokens=len(request.output_token_ids),
            min_tokens_suppress=tuple(sorted(suppress)),
            counts=request.token_counts,
            # Structured outputs: the grammar's allowed tokens, applied after every processor.
            allowed_tokens_mask=(
                mask
                if mask is not None or request.grammar is None
                else request.grammar.allowed_tokens(logits.shape[-1])
            ),
        )

    def _fail_after_forward(self, request: RequestState, error: Exception) -> None:
        log.exception("request %s failed after its forward", request.request_id)
        self._fail(request, RequestFailedError(f"the request failed: {error}"))

    def _emit(self, request: RequestState, token: SampledToken) -> None:
        request.output_token_ids.append(token.token_id)
        if request.token_counts is not None:
            request.token_counts.add(token.token_id)
        if request.grammar is not None:
            request.grammar.advance(token.token_id)
        if request.stats.time_to_first_token_seconds is None:
            request.stats.time_to_first_token_seconds = time.monotonic() - request.arrival_time
        request.events.put_nowait(token)
        reason = self._finish_reason(request, token)
        if reason is not None:
            self._complete(request, reason)

    def _complete(self, request: RequestState, reason: FinishReason) -> None:
        request.events.put_nowait(
            Finished(
                reason, request.num_prompt_tokens, len(request.output_token_ids), request.stats
            )
        )
        self.counters.num_finished += 1
        self._finish(request)
        stats = request.stats
        log.info(
            "request %s %s: %d prompt tokens (%d cached), %d generated, ttft %.1f ms, "
            "%d embedding bytes, %d preemptions",
            request.request_id,
            reason.value,
            request.num_prompt_tokens,
            stats.num_cached_prompt_tokens,
            len(request.output_token_ids),
            (stats.time_to_first_token_seconds or 0) * 1000,
            stats.num_embedding_bytes,
            stats.num_preemptions,
        )

    def _finish_reason(self, request: RequestState, token: SampledToken) -> FinishReason | None:
        options = request.spec.sampling
        if token.token_id in options.stop_token_ids or (
            not options.ignore_eos and token.token_id in self.family.eos_token_ids
        ):
            return FinishReason.STOP
        if request.grammar is not None and request.grammar.is_terminated:
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
        self.prefetcher.drop(request)
        self._requests.pop(request.request_id, None)
        self._release_leases(request)

    def _release_leases(self, request: RequestState) -> None:
        """Tells each encoder the request no longer needs its items pinned: their
        positions are in the KV cache (or the request is gone)."""
        if request.leases_released or not request.spec.items:
            return
        request.leases_released = True
        if self.embeddings.colocated is not None:
            self.embeddings.colocated.release(request.request_id)
            return
        # Any discovered encoder may hold one (the gateway's Encode went to the first
        # hint, fetches to the next ones when it failed, and a request without hints to
        # the decoder's own choice); releasing where none is held costs a no-op call,
        # as when the gateway's hints listed every encoder. An address the request
        # names but this decoder did not discover is never called.
        for address in self.embeddings.encoders.addresses:
            self._spawn(self._release_on(address, request.request_id))

    async def _release_on(self, address: str, owner: str) -> None:
        try:
            stub = encoder_pb2_grpc.EncoderServiceStub(self.embeddings.encoders.channel(address))
            await stub.ReleaseLeases(encoder_pb2.ReleaseLeasesRequest(lease_owner=owner), timeout=5)
        except Exception as error:  # the lease runs out by itself
            log.debug("releasing leases on %s failed: %s", address, error)

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _ends(event: Event) -> bool:
    return isinstance(event, (Finished, BaseException))


def _stall_state(request: RequestState) -> str:
    """What the stall log says of one request, to find the bug behind it, e.g.
    "r1 (computed 16 of 40, next chunk [16, 32) needs rows, fetched [[0, 16), [16, 32)])"."""
    chunk = request.next_chunk()
    needs = chunk is not None and request.chunk_needs_rows(*chunk)
    fetched = sorted(chunk for chunk, task in request.fetches.items() if task.done())
    return (
        f"{request.request_id} (computed {request.num_computed_tokens} of "
        f"{request.num_tokens}, next chunk {_half_open(chunk) if chunk else None}"
        f"{' needs rows' if needs else ''}, fetched "
        f"[{', '.join(map(_half_open, fetched))}])"
    )


def _half_open(chunk: tuple[int, int]) -> str:
    return f"[{chunk[0]}, {chunk[1]})"


async def _next_events(events: asyncio.Queue, min_tokens: int) -> list[Event]:
    """The next events of a request: until `min_tokens` tokens or an end (`Finished`, an
    error), then every event already queued up to the next end."""
    batch: list[Event] = []
    num_tokens = 0
    while not batch or not _ends(batch[-1]):
        if num_tokens >= min_tokens and events.empty():
            break
        batch.append(await events.get())
        num_tokens += isinstance(batch[-1], SampledToken)
    return batch
