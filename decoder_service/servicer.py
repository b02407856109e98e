"""gRPC face of the decoder: proto <-> domain objects, exceptions -> status codes."""

from __future__ import annotations

import grpc

from decoder_service.config import DecoderConfig
from decoder_service.embedding_client import FetchError
from decoder_service.engine import Engine, RequestFailedError, ShuttingDownError
from decoder_service.request import Finished, FinishReason, RequestStats, SampledToken
from decoder_service.spec import check_fits, spec_from_proto
from tessera.metrics import StatField, readings_from
from tessera.server import abort_unless_ready
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc

_FINISH_REASON_TO_PROTO = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
}


class DecoderServicer(decoder_pb2_grpc.DecoderServiceServicer):
    def __init__(self, config: DecoderConfig):
        self.config = config
        self.engine: Engine | None = None  # set once the model is loaded

    async def Generate(self, request, context):
        await abort_unless_ready(context, self.engine is not None)
        engine = self.engine
        try:
            spec = spec_from_proto(
                request,
                engine.family,
                engine.max_model_len,
                self.config.max_chunk_tokens,
                self.config.default_max_tokens,
            )
            check_fits(spec, engine.scheduler.kv, engine.scheduler.max_num_batched_tokens)
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        try:
            if spec.items:  # refused before it takes KV blocks, as a fetch would refuse it
                engine.embeddings.require_encoders()
            # One message for every token ready at once (one per step while the client
            # keeps up), then one for the end.
            async for events in engine.stream(spec):
                tokens = [event for event in events if isinstance(event, SampledToken)]
                if tokens:
                    yield decoder_pb2.DecodeResponse(tokens=token_batch_to_proto(tokens))
                if isinstance(events[-1], Finished):
                    yield decoder_pb2.DecodeResponse(finished=finished_to_proto(events[-1]))
        except FetchError as error:
            # The encoders failed, not this decoder: a status of its own, so that the
            # gateway does not set a healthy decoder aside for it.
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except ShuttingDownError as error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(error))
        except RequestFailedError as error:
            # This request alone: not a replica fault, so the gateway does not retry it.
            await context.abort(grpc.StatusCode.INTERNAL, str(error))

    async def GetStats(self, request, context):
        await abort_unless_ready(context, self.engine is not None)
        return engine_stats_to_proto(self.engine)


def engine_stats_to_proto(engine: Engine) -> decoder_pb2.DecoderStats:
    scheduler, counters = engine.scheduler, engine.counters
    kv = scheduler.kv.stats()
    return decoder_pb2.DecoderStats(
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_kv_blocks=kv.num_blocks,
        num_free_kv_blocks=kv.num_free_blocks,
        num_cached_kv_blocks=kv.num_cached_blocks,
        kv_block_size=scheduler.kv.block_size,
        num_prefix_queries=kv.num_prefix_queries,
        num_prefix_hit_blocks=kv.num_prefix_hit_blocks,
        num_preemptions=scheduler.num_preemptions,
        num_steps=counters.num_steps,
        num_batched_tokens=counters.num_batched_tokens,
        forward_seconds=counters.forward_seconds,
        fetch_wait_seconds=counters.fetch_wait_seconds,
        num_prefetch_pending_bytes=engine.prefetcher.num_pending_bytes,
        num_finished=counters.num_finished,
        num_aborted=counters.num_aborted,
        num_scheduled_requests=counters.num_scheduled_requests,
        num_stalls=counters.num_stalls,
        num_engine_errors=counters.num_engine_errors,
    )


def token_batch_to_proto(tokens: list[SampledToken]) -> decoder_pb2.TokenBatch:
    return decoder_pb2.TokenBatch(
        token_ids=[t.token_id for t in tokens],
        logprobs=[
            common_pb2.TokenLogprobs(
                token_id=t.token_id,
                logprob=t.logprob,
                top=[common_pb2.TopLogprob(token_id=x.token_id, logprob=x.logprob) for x in t.top],
            )
            for t in tokens
            if t.top
        ],
    )


def stats_to_proto(stats: RequestStats) -> decoder_pb2.DecodeStats:
    return decoder_pb2.DecodeStats(
        chunks=[
            decoder_pb2.PrefillChunkStats(
                start=c.start,
                end=c.end,
                num_embedding_rows=c.num_embedding_rows,
                num_embedding_bytes=c.num_embedding_bytes,
            )
            for c in stats.chunks
        ],
        num_embedding_bytes=stats.num_embedding_bytes,
        num_reencoded_items=stats.num_reencoded_items,
        fetch_wait_ms=stats.fetch_wait_seconds * 1000,
        time_to_first_token_ms=(stats.time_to_first_token_seconds or 0) * 1000,
        num_cached_prompt_tokens=stats.num_cached_prompt_tokens,
        num_preemptions=stats.num_preemptions,
    )


def finished_to_proto(event: Finished) -> decoder_pb2.DecodeFinished:
    return decoder_pb2.DecodeFinished(
        finish_reason=_FINISH_REASON_TO_PROTO[event.reason],
        usage=common_pb2.Usage(
            prompt_tokens=event.num_prompt_tokens,
            completion_tokens=event.num_output_tokens,
            cached_prompt_tokens=event.stats.num_cached_prompt_tokens,
        ),
        stats=stats_to_proto(event.stats),
    )


# Named as vLLM's (vllm:<suffix> -> tessera_decoder_<suffix>) where the concept is the same;
# docs/metrics.md maps each one.
DECODER_METRICS: tuple[StatField, ...] = (
    ("tessera_decoder_num_requests_running", "Requests running", "gauge", "num_running"),
    ("tessera_decoder_num_requests_waiting", "Requests waiting", "gauge", "num_waiting"),
    ("tessera_decoder_kv_blocks_free", "KV blocks not referenced", "gauge", "num_free_kv_blocks"),
    ("tessera_decoder_num_preemptions_total", "Requests preempted", "counter", "num_preemptions"),
    ("tessera_decoder_steps_total", "Engine steps", "counter", "num_steps"),
    (
        "tessera_decoder_batched_tokens_total",
        "Tokens run through forwards",
        "counter",
        "num_batched_tokens",
    ),
    ("tessera_decoder_forward_seconds_total", "Seconds in forwards", "counter", "forward_seconds"),
    (
        "tessera_decoder_fetch_wait_seconds_total",
        "Seconds the forward waited on embeddings",
        "counter",
        "fetch_wait_seconds",
    ),
    ("tessera_decoder_finished_total", "Requests finished", "counter", "num_finished"),
    (
        "tessera_decoder_engine_stalls_total",
        "Steps that could neither run nor wait for rows; their requests failed (a bug)",
        "counter",
        "num_stalls",
    ),
    (
        "tessera_decoder_engine_errors_total",
        "Errors the engine's loop caught; the requests it held failed (a bug)",
        "counter",
        "num_engine_errors",
    ),
    (
        "tessera_decoder_cancellations_total",
        "Requests aborted (cancelled, deadline, gone)",
        "counter",
        "num_aborted",
    ),
)


def metric_readings(engine: Engine):
    """What /metrics shows (see tessera.metrics): the GetStats fields above, plus a few
    derived or live values."""
    stats = engine_stats_to_proto(engine)
    yield from readings_from(stats, DECODER_METRICS)
    used = stats.num_kv_blocks - stats.num_free_kv_blocks
    yield (
        "tessera_decoder_kv_cache_usage_perc",
        "Fraction of KV blocks referenced by requests (0-1, as vLLM's)",
        "gauge",
        used / stats.num_kv_blocks,
    )
    yield (
        "tessera_decoder_prefix_cache_queries_total",
        "Prompt tokens looked up in the prefix cache",
        "counter",
        engine.scheduler.kv.stats().num_prefix_query_tokens,
    )
    yield (
        "tessera_decoder_prefix_cache_hits_total",
        "Prompt tokens found in the prefix cache",
        "counter",
        stats.num_prefix_hit_blocks * stats.kv_block_size,
    )
    yield (
        "tessera_decoder_embedding_bytes_received_total",
        "Embedding bytes received",
        "counter",
        engine.embeddings.num_bytes_received,
    )
    yield (
        "tessera_decoder_forwards_held_to_one_thread_total",
        "Forwards run on one torch thread while encoders on this host computed items "
        "this decoder fetched",
        "counter",
        engine.counters.num_held_forwards,
    )
    mirror = engine.runner.store.mirror
    yield (
        "tessera_decoder_decode_tokens_mirrored_total",
        "Decode tokens attended over the decode mirror's rows",
        "counter",
        mirror.num_mirrored if mirror else 0,
    )
    yield (
        "tessera_decoder_decode_tokens_gathered_total",
        "Decode tokens attended over contexts gathered from the paged KV cache",
        "counter",
        mirror.num_gathered if mirror else 0,
    )
