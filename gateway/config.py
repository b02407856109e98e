"""The gateway's settings, built once from flags and passed down."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.api_keys import ApiKeys, add_api_key_flags, api_keys_from_args
from gateway.generation_defaults import GENERATION_CONFIG_MODES
from gateway.tool_calls import PARSERS
from tessera.access import AccessRules, add_allow_callers_flag, rules_from_args
from tessera.config_common import (
    add_address_flag,
    add_common_flags,
    add_model_flags,
    add_replica_flags,
    add_served_model_name_flag,
    config_from_args,
)
from tessera.media import options_from_json
from tessera.media_decoder import MediaLimits, add_media_limit_flags
from tessera.metrics import add_metrics_flag
from tessera.sampling import DEFAULT_MAX_LOGPROBS, MAX_TOP_LOGPROBS
from tessera.startup_flags import (
    DEFAULT_ITEMS_PER_MODALITY,
    MediaCountLimits,
    chat_template_flag,
    limit_mm_per_prompt,
    port_number,
)
from tessera.tls import TlsFiles, add_tls_flags

# The gateway is the API for users: their certificates carry the `client` role.
GATEWAY_ACCESS = AccessRules("tessera.v1.GatewayService", {"Generate": frozenset({"client"})})


def _processing_options(value: str) -> dict[str, int]:
    try:
        return options_from_json(json.loads(value))
    except ValueError as error:  # json.JSONDecodeError is a ValueError too
        raise argparse.ArgumentTypeError(f"expected a JSON object of integers: {error}") from None


@dataclass(frozen=True)
class GatewayConfig:
    model: str
    host: str
    port: int
    encoders: tuple[str, ...]
    decoders: tuple[str, ...]
    media_limits: MediaLimits
    limit_mm_per_prompt: MediaCountLimits
    mm_processor_kwargs: dict[str, int]
    lease_ms: int
    replica_refresh_seconds: float
    replica_retry_seconds: float
    http_port: int
    served_model_name: Sequence[str] | None  # the names the API shows and answers to
    chat_template: str | None  # --chat-template: a file or the template itself
    max_request_bytes: int
    max_logprobs: int
    max_queued_requests: int
    request_timeout_seconds: float
    allowed_media_domains: tuple[str, ...]
    allow_private_media_hosts: tuple[str, ...]
    media_fetch_timeout_seconds: float
    max_media_bytes: int
    drain_seconds: float
    model_fingerprint: str | None
    log_level: str
    log_format: str
    log_stats_interval: float  # seconds between stats lines (0: none)
    metrics_port: int
    api_keys: ApiKeys  # from --api-key and the environment
    api_key_file: Path | None  # read at start
    tls: TlsFiles  # served with, and presented to the encoders and decoders
    access: AccessRules
    enable_reflection: bool
    health_port: int
    generation_config: str  # "auto": sampling defaults from the checkpoint; "vllm": neutral
    tool_call_parser: str  # how tool calls are read out of text (gateway/tool_calls.py)
    enable_auto_tool_choice: bool
    send_processed_images: bool  # --send-processed-images, as asked (see sends_processed_images)
    torch_threads: int = 0  # --torch-threads (0: torch's default)

    @property
    def sends_processed_images(self) -> bool:
        """Only an encoder that authenticated this gateway by its certificate (mutual TLS)
        may use an image's pixel values, so without one they are not sent."""
        return self.send_processed_images and bool(self.tls.cert_file)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GatewayConfig:
        if args.log_stats_interval < 0:
            raise SystemExit("--log-stats-interval must be >= 0 (0: off)")
        return config_from_args(
            cls,
            args,
            media_limits=MediaLimits.from_args(args),
            api_keys=api_keys_from_args(args),
            tls=TlsFiles.from_args(args),
            access=rules_from_args(args, GATEWAY_ACCESS),
        )


def _max_logprobs(value: str) -> int:
    number = int(value)
    if not 0 <= number <= MAX_TOP_LOGPROBS:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_TOP_LOGPROBS}]")
    return number


def add_gateway_flags(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    add_common_flags(parser, default_port=50051)
    add_api_key_flags(parser)
    add_metrics_flag(parser)
    add_tls_flags(parser)
    add_allow_callers_flag(parser, GATEWAY_ACCESS)
    add_address_flag(
        parser,
        "--encoders",
        "TESSERA_ENCODERS",
        "encoder addresses host:port[,...] or dns:///name:port for every address of a name; "
        "leave out when the decoders run --colocated-encoder",
        required=False,
    )
    add_address_flag(
        parser,
        "--decoders",
        "TESSERA_DECODERS",
        "decoder addresses host:port[,...] or dns:///name:port",
    )
    add_media_limit_flags(parser)
    parser.add_argument(
        "--limit-mm-per-prompt",
        type=limit_mm_per_prompt,
        default=MediaCountLimits(),
        metavar="LIMITS",
        help="most media items of each modality in one request, as vLLM takes it: "
        '\'{"image": 4, "audio": 1}\', image=4,audio=1, or one number for every modality '
        f"(default: {DEFAULT_ITEMS_PER_MODALITY} of each)",
    )
    parser.add_argument(
        "--mm-processor-kwargs",
        type=_processing_options,
        default={},
        help="processor settings for every media item, as JSON, e.g. '{\"max_pixels\": 200704}' "
        "for Qwen-VL (requests may override them with mm_processor_kwargs)",
    )
    parser.add_argument(
        "--http-port", type=port_number, default=0, help="OpenAI-compatible HTTP API port (0: off)"
    )
    add_served_model_name_flag(parser)
    parser.add_argument(
        "--chat-template",
        type=chat_template_flag,
        default=None,
        help="the chat template to render prompts with instead of the checkpoint's: a file, "
        "or the Jinja template itself (default: the checkpoint's)",
    )
    parser.add_argument(
        "--log-stats-interval",
        type=float,
        default=10.0,
        help="log a stats line (throughput, running/waiting, KV and cache hit rates) every "
        "this many seconds when anything happened (0: off)",
    )
    parser.add_argument(
        "--max-logprobs",
        type=_max_logprobs,
        default=DEFAULT_MAX_LOGPROBS,
        help=f"most top_logprobs (chat) or logprobs (completions) a request may ask for "
        f"(at most {MAX_TOP_LOGPROBS}, the decoder's bound)",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=32 << 20,
        help="largest request body; larger ones are refused before decoding",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=256,
        help="requests waiting for their first token beyond this are refused (429)",
    )
    parser.add_argument(
        "--request-timeout-seconds",
        type=float,
        default=600.0,
        help="deadline of a request that brings none of its own",
    )
    parser.add_argument(
        "--allowed-media-domains",
        type=lambda v: tuple(d.strip().lower() for d in v.split(",") if d.strip()),
        default=(),
        help="hosts image_url may fetch http(s) URLs from (default: none, data URLs only)",
    )
    parser.add_argument(
        "--allow-private-media-hosts",
        type=lambda v: tuple(d.strip().lower() for d in v.split(",") if d.strip()),
        default=(),
        help="allowed media hosts that may resolve to private, loopback or link-local "
        "addresses (default: none may)",
    )
    parser.add_argument(
        "--media-fetch-timeout-seconds", type=float, default=10.0, help="deadline of one fetch"
    )
    parser.add_argument(
        "--max-media-bytes",
        type=int,
        default=20 << 20,
        help="largest media file fetched from a URL (enforced while streaming)",
    )
    parser.add_argument(
        "--generation-config",
        choices=GENERATION_CONFIG_MODES,
        default="auto",
        help="auto: the checkpoint's generation_config.json gives the defaults of "
        "temperature, top_p, top_k, min_p and repetition_penalty for HTTP requests that "
        "leave them unset; vllm: neutral defaults (greedy)",
    )
    parser.add_argument(
        "--tool-call-parser",
        choices=PARSERS,
        default="hermes",
        help="how tool calls are parsed out of the output: hermes (<tool_call>{json}"
        "</tool_call>, Qwen and the demo models) or none (tools only reach the template)",
    )
    parser.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='allow tool_choice "auto" (the model decides whether to call; vLLM\'s flag)',
    )
    parser.add_argument(
        "--send-processed-images",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with a client certificate (mutual TLS), send each image whose processed "
        "pixel values are smaller than its decoded pixels to its encoder as those values, "
        "not the file: an encoder that trusts this gateway's content hashes runs its tower "
        "on them instead of decoding the file again; one that does not asks for files, "
        "and gets only files from then on",
    )
    add_replica_flags(parser)
    parser.add_argument(
        "--lease-ms",
        type=int,
        default=60_000,
        help="how long encoders pin a request's items before the decoder releases them",
    )
