"""`tessera decoder`: one decoder replica."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import torch

from decoder_service.config import DecoderConfig, add_decoder_flags
from decoder_service.embedding_client import EmbeddingClient
from decoder_service.engine import Engine
from decoder_service.kv_cache import KVCacheManager
from decoder_service.model_runner import ModelRunner
from decoder_service.paged_attention import ATTENTION_NAME, PagedKVStore
from decoder_service.prefetch import Prefetcher
from decoder_service.scheduler import UNLIMITED, Scheduler
from decoder_service.servicer import DecoderServicer, metric_readings
from tessera.adapters import LoadOptions, ModelFamily, ModelPart, load_family
from tessera.channels import ChannelPool
from tessera.compute_thread import compute_thread, set_torch_threads
from tessera.config_common import served_model_name
from tessera.cpus import usable_cpus
from tessera.logs import configure_logging
from tessera.metrics import new_registry, serve_metrics
from tessera.replicas import ReplicaSet
from tessera.server import serve, service_spec
from tessera.startup_flags import HelpFormatter
from tessera.tensor_codec import dtype_name
from tessera.thread_governor import governor_for_this_process
from tessera.v1 import decoder_pb2_grpc

log = logging.getLogger("tessera.decoder")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="tessera decoder", formatter_class=HelpFormatter
    )
    add_decoder_flags(parser)
    return parser


def kv_cache_bytes(config: DecoderConfig, device: torch.device) -> int:
    """--kv-cache-bytes, or --kv-cache-memory-fraction of the device's memory."""
    if not config.kv_cache_memory_fraction:
        return config.kv_cache_bytes
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total * config.kv_cache_memory_fraction)


def encoder_replicas(config: DecoderConfig) -> ReplicaSet:
    """The encoders of --encoders: the only ones this decoder will dial. Its channel pool
    serves nothing else, so it holds one channel per encoder of the fleet."""
    return ReplicaSet(
        "encoder",
        config.encoders,
        ChannelPool(tls=config.tls),
        config.replica_refresh_seconds,
        config.replica_retry_seconds,
    )


def build_kv_store(config: DecoderConfig, family: ModelFamily) -> PagedKVStore:
    """The paged KV cache as --kv-cache-bytes (or the memory fraction) sizes it, with its
    decode mirror (--decode-kv-mirror-bytes; by default a quarter of the cache's memory)."""
    shape = family.kv_shape()
    bytes_per_block = PagedKVStore.bytes_per_block(
        shape.num_layers, config.block_size, shape.num_kv_heads, shape.head_dim, family.dtype
    )
    cache_bytes = kv_cache_bytes(config, family.device)
    num_blocks = cache_bytes // bytes_per_block
    if num_blocks < 1:
        raise SystemExit(f"the KV cache budget holds no block of {bytes_per_block} B")
    mirror_bytes = config.decode_kv_mirror_bytes
    if mirror_bytes is None:  # room for the decode batch to hold a quarter of the cache
        mirror_bytes = cache_bytes // 4
    log.info(
        "KV cache: %d blocks of %d tokens (%d B each, %d tokens in all); decode mirror: "
        "up to %d MiB",
        num_blocks,
        config.block_size,
        bytes_per_block,
        num_blocks * config.block_size,
        mirror_bytes >> 20,
    )
    # Allocated (zero-filled, a parallel op) on the compute thread, like every torch op.
    return compute_thread().call(
        PagedKVStore,
        shape.num_layers,
        num_blocks,
        config.block_size,
        shape.num_kv_heads,
        shape.head_dim,
        family.dtype,
        family.device,
        mirror_bytes,
    )


def build_engine(config: DecoderConfig, family: ModelFamily, encoders: ReplicaSet) -> Engine:
    check_item_budget(config, family)
    max_model_len = min(config.max_model_len or family.max_model_len, family.max_model_len)
    store = build_kv_store(config, family)
    kv = KVCacheManager(store.num_blocks, config.block_size, config.enable_prefix_caching)
    row_width = family.hidden_size * family.num_planes
    colocated = None
    if config.colocated_encoder:
        from decoder_service.colocated import ColocatedEncoder

        colocated = ColocatedEncoder(
            family, config.colocated_cache_bytes, config.lease_ms, config.device
        )
    embeddings = EmbeddingClient(
        encoders,
        row_width,
        config.lease_ms,
        config.fetch_timeout_seconds,
        fetch_whole=config.fetch_mode == "whole",
        colocated=colocated,
        model_fingerprint=family.fingerprint,
    )
    # Rows usually arrive as float32; the bound is an estimate, not an exact count.
    prefetcher = Prefetcher(embeddings, config.max_prefetch_bytes, row_width * 4)
    # An item the decoder sends again is named to its encoder once in flight there.
    embeddings.reencoder.on_announced = prefetcher.expediter.now_computing
    threads = None
    if config.adapt_torch_threads and family.device.type == "cpu":
        # At most what --torch-threads gives, not the pool's size now: an earlier engine's
        # governor in this process (tests, benchmarks) may have shrunk it.
        max_threads = config.torch_threads or usable_cpus()
        threads = compute_thread().call(governor_for_this_process, max_threads)
    if threads is not None and config.hold_threads_while_encoding:
        log.info("the encoders share this host's CPUs: one torch thread while they compute")
    return Engine(
        family,
        Scheduler(
            kv,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.max_prefills_per_step or UNLIMITED,
            config.max_prefill_age_steps,
            config.prefill_token_budget,
        ),
        ModelRunner(family, store),
        prefetcher,
        embeddings,
        max_model_len,
        threads,
        config.stream_interval,
        hold_threads_while_encoding=config.hold_threads_while_encoding,
    )


def load_options(config: DecoderConfig) -> LoadOptions:
    """The parts of the checkpoint the decoder runs, and how (benchmarks load the same)."""
    parts = ModelPart.PROCESSOR | ModelPart.LANGUAGE_MODEL
    if config.colocated_encoder:
        parts |= ModelPart.MEDIA_ENCODER
    return LoadOptions(
        parts,
        config.device,
        config.dtype,  # a name; "auto" is resolved against the checkpoint
        text_attention=ATTENTION_NAME,
        linear_kernel=config.linear_kernel,
    )


def check_item_budget(config: DecoderConfig, family: ModelFamily) -> None:
    """A family that computes each item in one step needs steps that can hold one."""
    rows = family.fixed_item_rows
    if not family.attention.split_items and rows and rows > config.max_num_batched_tokens:
        raise SystemExit(
            f"{family.name} computes each image ({rows} rows) in one step, but "
            f"--max-num-batched-tokens is {config.max_num_batched_tokens}: raise it to {rows} "
            "or more"
        )


async def run(config: DecoderConfig) -> None:
    servicer = DecoderServicer(config)
    encoders = encoder_replicas(config)

    async def load() -> str:
        await encoders.start()
        if not config.colocated_encoder and not config.encoders:
            log.warning("no --encoders: requests with media items will be refused")
        family = await compute_thread().run(
            load_family, config.model, load_options(config), config.model_fingerprint
        )
        engine = build_engine(config, family, encoders)
        engine.start()
        servicer.engine = engine
        labels = {"model_name": served_model_name(config.model, config.served_model_name)}
        registry = new_registry(lambda: metric_readings(engine), labels)
        serve_metrics(config.metrics_port, config.host, registry)
        kv = engine.scheduler.kv
        sources = "colocated" if config.colocated_encoder else ",".join(config.encoders)
        return (
            f"family={family.name} device={config.device} dtype={dtype_name(family.dtype)} "
            f"max_model_len={engine.max_model_len} max_chunk_tokens={config.max_chunk_tokens} "
            f"max_num_seqs={config.max_num_seqs} "
            f"max_num_batched_tokens={config.max_num_batched_tokens} "
            f"kv_blocks={kv.num_blocks}x{kv.block_size} prefix_caching={kv.enable_prefix_caching} "
            f"adapt_torch_threads={'on' if engine.threads else 'off'} "
            f"linear={family.linear_kernel} "
            f"metrics_port={config.metrics_port or 'off'} "
            f"encoders={sources or 'none'}"
        )

    async def drain(seconds: float) -> None:
        if servicer.engine is not None:
            await servicer.engine.drain(seconds)

    spec = service_spec("decoder", config)
    try:
        await serve(
            spec,
            lambda server: decoder_pb2_grpc.add_DecoderServiceServicer_to_server(servicer, server),
            load,
            drain=drain,
        )
    finally:
        await encoders.stop()


def main(args: argparse.Namespace) -> None:
    config = DecoderConfig.from_args(args)
    configure_logging(config.log_level, config.log_format)
    set_torch_threads(config.torch_threads)
    asyncio.run(run(config))
