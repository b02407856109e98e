"""`tessera encoder`: one encoder replica."""

from __future__ import annotations

import argparse
import asyncio

import torch

from encoder_service.config import EncoderConfig, add_encoder_flags
from encoder_service.encoder import EncoderCore
from encoder_service.memory_store import MemoryStore
from encoder_service.servicer import EncoderServicer
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.server import configure_logging, serve, service_spec
from tessera.v1 import encoder_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="tessera encoder")
    add_encoder_flags(parser)
    return parser


async def run(config: EncoderConfig) -> None:
    servicer = EncoderServicer(config.default_lease_ms, config.slice_message_bytes)

    async def load() -> str:
        options = LoadOptions(
            ModelPart.PROCESSOR | ModelPart.MEDIA_ENCODER,
            config.device,
            getattr(torch, config.dtype),
        )
        family = await asyncio.to_thread(
            load_family, config.model, options, config.model_fingerprint
        )
        store = MemoryStore(config.cache_bytes)
        servicer.core = EncoderCore(family, store, config.max_batch_items, config.max_image_pixels)
        return (
            f"family={family.name} fingerprint={family.fingerprint} device={config.device} "
            f"dtype={config.dtype} cache_bytes={config.cache_bytes}"
        )

    spec = service_spec("encoder", config, "EncoderService")
    await serve(
        spec,
        lambda server: encoder_pb2_grpc.add_EncoderServiceServicer_to_server(servicer, server),
        load,
    )


def main(args: argparse.Namespace) -> None:
    config = EncoderConfig.from_args(args)
    configure_logging(config.log_level)
    asyncio.run(run(config))
