"""`tessera gateway`: the front door (gRPC, and the OpenAI-compatible HTTP API)."""

from __future__ import annotations

import argparse
import asyncio

from gateway.api_keys import with_key_file
from gateway.config import GatewayConfig, add_gateway_flags
from gateway.front import GatewayFront
from gateway.generation_defaults import load_sampling_defaults
from gateway.http_server import HttpApi, start_http
from gateway.media_fetch import MediaFetchPolicy
from gateway.pipeline import GenerationPipeline
from gateway.prompt import PromptBuilder
from gateway.router import DecoderRouter
from gateway.servicer import GatewayServicer
from gateway.stats_log import StatsLogger, decoders_stats
from gateway.tools import ToolSettings
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.channels import ChannelPool
from tessera.compute_thread import compute_thread, set_torch_threads
from tessera.config_common import served_model_names
from tessera.logs import configure_logging
from tessera.metrics import new_registry, serve_metrics
from tessera.replicas import ReplicaSet
from tessera.server import serve, service_spec
from tessera.startup_flags import HelpFormatter, load_chat_template
from tessera.v1 import gateway_pb2_grpc


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="tessera gateway", formatter_class=HelpFormatter
    )
    add_gateway_flags(parser)
    return parser


def hidden_model_names(config: GatewayConfig) -> list[str]:
    """Names requests may use that no listing shows: without --served-model-name, the
    --model argument itself (vLLM's default name)."""
    return [] if config.served_model_name else [config.model]


async def run(config: GatewayConfig) -> None:
    servicer = GatewayServicer()
    background: set[asyncio.Task] = set()  # kept referenced while the gateway runs

    async def load() -> str:
        chat_template = load_chat_template(config.chat_template) if config.chat_template else None
        options = LoadOptions(ModelPart.PROCESSOR, chat_template=chat_template)
        family = await compute_thread().run(
            load_family, config.model, options, config.model_fingerprint
        )
        # Fails the start, not each request, when the checkpoint's sampling settings are wrong.
        sampling_defaults = await asyncio.to_thread(
            load_sampling_defaults, config.model, config.generation_config
        )
        # Fails the start, not each request, when --mm-processor-kwargs is wrong.
        family.processing_options(config.mm_processor_kwargs, num_items=1)
        builder = PromptBuilder(
            family,
            config.media_limits,
            config.limit_mm_per_prompt,
            config.mm_processor_kwargs,
            config.sends_processed_images,
        )
        processed_images = "off"
        if config.sends_processed_images and family.processed_pixels_shape:
            processed_images = "x".join(map(str, family.processed_pixels_shape))
        channels = ChannelPool(tls=config.tls)
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
        pipeline = GenerationPipeline(
            builder, encoders, DecoderRouter(decoders), channels, config.lease_ms
        )
        registry = new_registry()
        front = GatewayFront(
            pipeline,
            served_model_names(config.model, config.served_model_name),
            config.max_queued_requests,
            registry,
            hidden_names=hidden_model_names(config),
        )
        servicer.front = front
        api_keys = with_key_file(config.api_keys, config.api_key_file)
        servicer.api_keys = api_keys
        serve_metrics(config.metrics_port, config.host, registry)
        if config.log_stats_interval:
            stats = StatsLogger(
                registry,
                front.model_name,
                lambda: decoders_stats(decoders.addresses, decoders.channel),
            )
            background.add(asyncio.create_task(stats.run(config.log_stats_interval)))
        http = "off"
        if config.http_port:
            policy = MediaFetchPolicy(
                config.allowed_media_domains,
                config.allow_private_media_hosts,
                config.media_fetch_timeout_seconds,
                config.max_media_bytes,
            )
            api = HttpApi(
                front,
                registry,
                policy,
                config.max_request_bytes,
                config.request_timeout_seconds,
                [encoders, decoders],
                api_keys,
                metrics_route=not config.metrics_port,
                sampling_defaults=sampling_defaults,
                tool_settings=ToolSettings(config.tool_call_parser, config.enable_auto_tool_choice),
                max_logprobs=config.max_logprobs,
            )
            await start_http(api.app, config.host, config.http_port)
            http = f"http://{config.host}:{config.http_port}"
        return (
            f"family={family.name} served_model_name={','.join(front.model_names)} "
            f"fingerprint={family.fingerprint} http={http} "
            f"api_keys={len(api_keys.keys) or 'none'} "
            f"metrics_port={config.metrics_port or 'on the http port'} "
            f"encoders={','.join(config.encoders)} decoders={','.join(config.decoders)} "
            f"limit_mm_per_prompt={config.limit_mm_per_prompt.describe()} "
            f"chat_template={'--chat-template' if config.chat_template else 'the checkpoint'} "
            f"max_request_bytes={config.max_request_bytes} "
            f"max_queued_requests={config.max_queued_requests} "
            f"allowed_media_domains={','.join(config.allowed_media_domains) or 'none'} "
            f"processed_images={processed_images}"
        )

    spec = service_spec("gateway", config)
    await serve(
        spec,
        lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        load,
    )


def main(args: argparse.Namespace) -> None:
    config = GatewayConfig.from_args(args)
    configure_logging(config.log_level, config.log_format)
    set_torch_threads(config.torch_threads)
    asyncio.run(run(config))
