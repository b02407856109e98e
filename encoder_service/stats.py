"""What the encoder counts: GetStats' message and the /metrics readings made from it."""

from __future__ import annotations

from encoder_service.encoder import EncoderCore
from tessera.metrics import StatField, readings_from
from tessera.v1 import encoder_pb2


def stats_to_proto(core: EncoderCore) -> encoder_pb2.EncoderStats:
    counters, store, batches = core.counters, core.store, core.batcher.stats
    shared = getattr(core.shared, "stats", None)
    return encoder_pb2.EncoderStats(
        num_items_requested=counters.num_items_requested,
        num_items_computed=counters.num_items_computed,
        num_memory_hits=counters.num_memory_hits,
        num_joined_in_flight=counters.num_joined_in_flight,
        num_slice_misses=counters.num_slice_misses,
        num_bytes_served=counters.num_bytes_served,
        num_evictions=store.stats.num_evictions,
        num_cached_items=len(store),
        num_cached_bytes=store.num_bytes,
        num_batches=batches.num_batches,
        num_redis_hits=counters.num_redis_hits,
        num_remote_waits=counters.num_remote_waits,
        num_corrupt_entries=shared.num_corrupt if shared else 0,
        num_redis_errors=shared.num_errors if shared else 0,
        degraded=bool(shared and shared.degraded),
        num_batched_items=batches.num_items,
        max_batch_size=batches.max_batch_size,
        redis_enabled=core.shared is not None,
        num_pinned_bytes=store.num_pinned_bytes,
        num_pins_refused=store.stats.num_pins_refused,
        num_hashes_verified=counters.num_hashes_verified,
        num_hashes_trusted=counters.num_hashes_trusted,
        num_slice_calls=counters.num_slice_calls,
        num_pixel_values_used=counters.num_pixel_values_used,
        num_pixel_values_ignored=counters.num_pixel_values_ignored,
        num_expedite_calls=counters.num_expedite_calls,
        num_expedited_batches=counters.num_expedited_batches,
        num_batcher_errors=batches.num_errors,
    )


ENCODER_METRICS: tuple[StatField, ...] = (
    (
        "tessera_encoder_items_requested_total",
        "Items named in Encode requests",
        "counter",
        "num_items_requested",
    ),
    (
        "tessera_encoder_items_computed_total",
        "Items whose rows were computed",
        "counter",
        "num_items_computed",
    ),
    (
        "tessera_encoder_memory_hits_total",
        "Items served from memory (L1)",
        "counter",
        "num_memory_hits",
    ),
    (
        "tessera_encoder_redis_hits_total",
        "Items served from Redis (L2)",
        "counter",
        "num_redis_hits",
    ),
    (
        "tessera_encoder_joined_in_flight_total",
        "Requests that joined a computation in flight",
        "counter",
        "num_joined_in_flight",
    ),
    (
        "tessera_encoder_slice_misses_total",
        "Slice requests for unknown items",
        "counter",
        "num_slice_misses",
    ),
    ("tessera_encoder_bytes_sent_total", "Embedding bytes streamed", "counter", "num_bytes_served"),
    (
        "tessera_encoder_corrupt_entries_total",
        "Corrupt Redis entries dropped",
        "counter",
        "num_corrupt_entries",
    ),
    ("tessera_encoder_redis_errors_total", "Failed Redis calls", "counter", "num_redis_errors"),
    ("tessera_encoder_batches_total", "Encoder forwards", "counter", "num_batches"),
    (
        "tessera_encoder_batched_items_total",
        "Items in those forwards",
        "counter",
        "num_batched_items",
    ),
    ("tessera_encoder_max_batch_size", "Largest batch so far", "gauge", "max_batch_size"),
    ("tessera_encoder_cached_items", "Items in the memory cache", "gauge", "num_cached_items"),
    ("tessera_encoder_cached_bytes", "Bytes in the memory cache", "gauge", "num_cached_bytes"),
    ("tessera_encoder_pinned_bytes", "Cache bytes pinned by leases", "gauge", "num_pinned_bytes"),
    (
        "tessera_encoder_pins_refused_total",
        "Pins not granted for the pin bounds (item stays evictable)",
        "counter",
        "num_pins_refused",
    ),
    (
        "tessera_encoder_hashes_verified_total",
        "Items computed whose content hash was checked against their decoded content",
        "counter",
        "num_hashes_verified",
    ),
    (
        "tessera_encoder_hashes_trusted_total",
        "Items computed whose content hash was taken from a trusted caller unchecked",
        "counter",
        "num_hashes_trusted",
    ),
    (
        "tessera_encoder_pixel_values_used_total",
        "Items computed from a trusted gateway's processed pixel values (file not decoded)",
        "counter",
        "num_pixel_values_used",
    ),
    (
        "tessera_encoder_pixel_values_ignored_total",
        "Items whose pixel values came from an untrusted caller (file decoded instead)",
        "counter",
        "num_pixel_values_ignored",
    ),
    (
        "tessera_encoder_slice_calls_total",
        "GetEmbeddingSlices and GetEmbeddingRows calls answered",
        "counter",
        "num_slice_calls",
    ),
    (
        "tessera_encoder_expedite_calls_total",
        "Expedite calls (a decoder idles for items in flight here)",
        "counter",
        "num_expedite_calls",
    ),
    (
        "tessera_encoder_expedited_batches_total",
        "Batches run on --expedite-torch-threads without waiting to fill",
        "counter",
        "num_expedited_batches",
    ),
    (
        "tessera_encoder_batcher_errors_total",
        "Batches failed by an error around the model; their items failed (a bug)",
        "counter",
        "num_batcher_errors",
    ),
    (
        "tessera_encoder_degraded",
        "1 while Redis is configured but unreachable",
        "gauge",
        "degraded",
    ),
)


def metric_readings(core: EncoderCore):
    """What /metrics shows (see tessera.metrics): the GetStats fields above, plus a few
    derived or live values."""
    stats = stats_to_proto(core)
    yield from readings_from(stats, ENCODER_METRICS)
    busy = core.batcher.stats
    yield (
        "tessera_encoder_queue_depth",
        "Items waiting for an encoder forward",
        "gauge",
        core.batcher.queue_depth,
    )
    yield (
        "tessera_encoder_busy_seconds_total",
        "Seconds spent in encoder forwards",
        "counter",
        busy.busy_seconds,
    )
