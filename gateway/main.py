"""`tessera gateway`: the front door."""

from __future__ import annotations

import argparse
import asyncio

from gateway.config import GatewayConfig, add_gateway_flags
from gateway.pipeline import GenerationPipeline
from gateway.prompt import PromptBuilder
from gateway.replicas import ReplicaSet
from gateway.router import DecoderRouter
from gateway.servicer import GatewayServicer
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.channels import ChannelPool
from tessera.server import configure_logging, serve, service_spec
from tessera.v1 import gateway_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="tessera gateway")
    add_gateway_flags(parser)
    return parser


async def run(config: GatewayConfig) -> None:
    servicer = GatewayServicer()

    async def load() -> str:
        family = await asyncio.to_thread(
            load_family, config.model, LoadOptions(ModelPart.PROCESSOR), config.model_fingerprint
        )
        builder = PromptBuilder(family, config.max_image_pixels, config.max_items_per_prompt)
        channels = ChannelPool()
        encoders, decoders = (
            ReplicaSet(
                name,
                targets,
                channels,
                config.replica_refresh_seconds,
                config.replica_retry_seconds,
            )
            for name, targets in (("encoder", config.encoders), ("decoder", config.decoders))
        )
        await encoders.start()
        await decoders.start()
        servicer.pipeline = GenerationPipeline(
            builder, encoders, DecoderRouter(decoders), channels, config.lease_ms
        )
        return (
            f"family={family.name} fingerprint={family.fingerprint} "
            f"encoders={','.join(config.encoders)} decoders={','.join(config.decoders)}"
        )

    spec = service_spec("gateway", config, "GatewayService")
    await serve(
        spec,
        lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        load,
    )


def main(args: argparse.Namespace) -> None:
    config = GatewayConfig.from_args(args)
    configure_logging(config.log_level)
    asyncio.run(run(config))
