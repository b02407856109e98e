"""`tessera encoder`: one encoder replica."""

from __future__ import annotations

import argparse
import asyncio
import socket

from encoder_service.config import EncoderConfig, add_encoder_flags
from encoder_service.encoder import EncoderCore
from encoder_service.expedite import tower_threads
from encoder_service.hash_trust import HashTrust
from encoder_service.items import FleetSettings
from encoder_service.memory_store import MemoryStore
from encoder_service.redis_connection import redis_settings
from encoder_service.redis_format import RowShape
from encoder_service.servicer import CallLimits, EncoderServicer, add_to_server
from encoder_service.stats import metric_readings
from tessera.adapters import LoadOptions, ModelFamily, ModelPart, load_family
from tessera.compute_thread import compute_thread, set_torch_threads
from tessera.logs import configure_logging
from tessera.metrics import new_registry, serve_metrics
from tessera.server import serve, service_spec
from tessera.startup_flags import HelpFormatter
from tessera.tensor_codec import dtype_name


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="tessera encoder", formatter_class=HelpFormatter
    )
    add_encoder_flags(parser)
    return parser


async def run(config: EncoderConfig) -> None:
    redis = redis_settings(config)
    limits = CallLimits(
        config.default_lease_ms,
        config.max_lease_ms,
        config.max_slices_per_call,
        config.max_slice_bytes_per_call,
    )
    trust = HashTrust.of(config.trust_content_hashes_from, config.tls.mutual)
    servicer = EncoderServicer(limits, config.slice_message_bytes, trust)

    async def load() -> str:
        options = LoadOptions(
            ModelPart.PROCESSOR | ModelPart.MEDIA_ENCODER,
            config.device,
            config.dtype,  # a name; "auto" is resolved against the checkpoint
        )
        family = await compute_thread().run(
            load_family, config.model, options, config.model_fingerprint
        )
        threads = await compute_thread().run(
            tower_threads, family.media_encoder_modules(), config.expedite_torch_threads
        )
        shared = None
        if redis is not None:
            from encoder_service.redis_store import RedisStore

            shared = RedisStore(
                redis.connection,
                family.fingerprint,
                ttl_seconds=config.redis_ttl_seconds,
                timeout_seconds=config.redis_timeout_seconds,
                max_connections=config.redis_max_connections,
                mac=redis.mac,
                row_shape=row_shape(family),
            )
            # Kept on the servicer: the task lives as long as the server.
            servicer.background.append(asyncio.create_task(shared.watch()))
            await shared.ping()  # so the start line and stats say at once if Redis is down
        fleet = FleetSettings(
            config.replica_id or f"{socket.gethostname()}:{config.port}",
            config.compute_lease_ms,
            config.remote_wait_seconds,
        )
        servicer.core = EncoderCore(
            family,
            MemoryStore(config.cache_bytes, config.pin_limits()),
            config.max_batch_items,
            config.max_batch_wait_ms,
            config.media_limits,
            shared,
            fleet,
            config.max_batch_pixels,
            threads,
        )
        core = servicer.core
        serve_metrics(config.metrics_port, config.host, new_registry(lambda: metric_readings(core)))
        return (
            f"family={family.name} fingerprint={family.fingerprint} device={config.device} "
            f"dtype={dtype_name(family.dtype)} cache_bytes={config.cache_bytes} "
            f"max_batch_items={config.max_batch_items} "
            f"expedite_torch_threads={threads.wide} "
            f"redis={redis.describe() if redis else 'off'} "
            f"replica={fleet.replica_id} metrics_port={config.metrics_port or 'off'} "
            f"hashes_trusted_from={trust.describe()}"
        )

    spec = service_spec("encoder", config)
    await serve(
        spec,
        lambda server: add_to_server(servicer, server),
        load,
    )


def row_shape(family: ModelFamily) -> RowShape:
    """What this encoder's rows are: a Redis entry that states another shape is refused."""
    return RowShape(family.num_planes * family.hidden_size, dtype_name(family.dtype))


def main(args: argparse.Namespace) -> None:
    config = EncoderConfig.from_args(args)
    configure_logging(config.log_level, config.log_format)
    set_torch_threads(config.torch_threads)
    asyncio.run(run(config))
