"""`tessera decoder`: one decoder replica."""

from __future__ import annotations

import argparse
import asyncio

import torch

from decoder_service.config import DecoderConfig, add_decoder_flags
from decoder_service.embedding_client import EmbeddingClient
from decoder_service.engine import Engine
from decoder_service.scheduler import Scheduler
from decoder_service.servicer import DecoderServicer
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.channels import ChannelPool
from tessera.server import configure_logging, serve, service_spec
from tessera.v1 import decoder_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="tessera decoder")
    add_decoder_flags(parser)
    return parser


async def run(config: DecoderConfig) -> None:
    servicer = DecoderServicer(config)

    async def load() -> str:
        options = LoadOptions(
            ModelPart.PROCESSOR | ModelPart.LANGUAGE_MODEL,
            config.device,
            getattr(torch, config.dtype),
        )
        family = await asyncio.to_thread(
            load_family, config.model, options, config.model_fingerprint
        )
        max_model_len = min(config.max_model_len or family.max_model_len, family.max_model_len)
        embeddings = EmbeddingClient(
            ChannelPool(), family.hidden_size, config.lease_ms, config.fetch_timeout_seconds
        )
        engine = Engine(
            family,
            Scheduler(config.max_num_seqs, config.max_num_batched_tokens),
            embeddings,
            max_model_len,
        )
        engine.start()
        servicer.engine = engine
        return (
            f"family={family.name} device={config.device} dtype={config.dtype} "
            f"max_model_len={max_model_len} max_chunk_tokens={config.max_chunk_tokens} "
            f"max_num_seqs={config.max_num_seqs}"
        )

    spec = service_spec("decoder", config, "DecoderService")
    await serve(
        spec,
        lambda server: decoder_pb2_grpc.add_DecoderServiceServicer_to_server(servicer, server),
        load,
    )


def main(args: argparse.Namespace) -> None:
    config = DecoderConfig.from_args(args)
    configure_logging(config.log_level)
    asyncio.run(run(config))
