"""The decoder's settings, built once from flags and passed down."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tessera.access import ANY_CALLER, AccessRules, add_allow_callers_flag, rules_from_args
from tessera.config_common import (
    add_address_flag,
    add_common_flags,
    add_model_flags,
    add_replica_flags,
    add_served_model_name_flag,
    config_from_args,
    env_default,
)
from tessera.linear_kernels import AUTO, LINEAR_KERNELS
from tessera.metrics import add_metrics_flag
from tessera.replicas import on_this_host
from tessera.tls import TlsFiles, add_tls_flags


def _linear_kernel(value: str) -> str:
    if value not in LINEAR_KERNELS:
        raise SystemExit(f"TESSERA_LINEAR_KERNEL={value!r}: use one of {', '.join(LINEAR_KERNELS)}")
    return value


# Only the gateway generates: it builds the prompt and owns the request's leases.
DECODER_ACCESS = AccessRules(
    "tessera.v1.DecoderService",
    {"Generate": frozenset({"gateway"}), "GetStats": frozenset({ANY_CALLER})},
)


@dataclass(frozen=True)
class DecoderConfig:
    model: str
    host: str
    port: int
    # The only encoders this decoder dials; a request's encoder_addresses are hints
    # among them. Empty: requests with media are refused.
    encoders: tuple[str, ...]
    replica_refresh_seconds: float
    replica_retry_seconds: float
    device: str
    dtype: str
    max_chunk_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_prefills_per_step: int  # 0: as many as the prefill token budget holds
    max_prefill_tokens_per_step: int  # 0: --max-chunk-tokens
    max_prefill_age_steps: int
    max_model_len: int | None
    default_max_tokens: int
    stream_interval: int
    fetch_timeout_seconds: float
    lease_ms: int
    kv_cache_bytes: int
    kv_cache_memory_fraction: float
    block_size: int
    decode_kv_mirror_bytes: int | None  # None: a quarter of the KV cache's memory
    enable_prefix_caching: bool
    adapt_torch_threads: bool
    encoders_share_cpus: bool | None  # None: whether every --encoders address is this host
    linear_kernel: str
    max_prefetch_bytes: int
    fetch_mode: str
    colocated_encoder: bool
    colocated_cache_bytes: int
    drain_seconds: float
    model_fingerprint: str | None
    served_model_name: list[str] | None  # the first is the model_name label of its metrics
    log_level: str
    log_format: str
    metrics_port: int
    tls: TlsFiles  # served with, and presented to the encoders
    access: AccessRules
    enable_reflection: bool
    health_port: int
    torch_threads: int = 0  # --torch-threads (0: torch's default)

    @property
    def prefill_token_budget(self) -> int:
        """--max-prefill-tokens-per-step, where 0 means one chunk's worth."""
        return self.max_prefill_tokens_per_step or self.max_chunk_tokens

    @property
    def hold_threads_while_encoding(self) -> bool:
        """Whether forwards run on one torch thread while the encoders compute items this
        decoder fetches (`ThreadGovernor.hold_one_thread`): they share its CPUs, by
        --encoders-share-cpus or, by default, because every encoder address is this host."""
        if not self.adapt_torch_threads or self.colocated_encoder:
            return False
        if self.encoders_share_cpus is not None:
            return self.encoders_share_cpus
        return bool(self.encoders) and all(map(on_this_host, self.encoders))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DecoderConfig:
        config = config_from_args(
            cls, args, tls=TlsFiles.from_args(args), access=rules_from_args(args, DECODER_ACCESS)
        )
        if config.max_chunk_tokens < 1:
            raise SystemExit(f"--max-chunk-tokens must be >= 1, got {config.max_chunk_tokens}")
        # With room for one chunk beside every other request's decode, the first prompt in
        # prefill order always gets its chunk; with the age bound, no prompt starves
        # behind a stream of short requests.
        needed = config.max_chunk_tokens + config.max_num_seqs - 1
        if config.max_num_batched_tokens < needed:
            raise SystemExit(
                f"--max-num-batched-tokens must be >= --max-chunk-tokens + --max-num-seqs - 1 "
                f"({needed}), so a prompt chunk always fits beside the running decodes; got "
                f"{config.max_num_batched_tokens}"
            )
        if min(config.max_prefills_per_step, config.max_prefill_tokens_per_step) < 0:
            raise SystemExit(
                "--max-prefills-per-step and --max-prefill-tokens-per-step must be >= 0 "
                "(0: no count limit; 0: one chunk's worth, --max-chunk-tokens)"
            )
        if config.stream_interval < 1:
            raise SystemExit(f"--stream-interval must be >= 1 token, got {config.stream_interval}")
        if config.max_prefill_age_steps < 0:
            raise SystemExit("--max-prefill-age-steps must be >= 0")
        if config.colocated_encoder and config.encoders:
            raise SystemExit(
                "--colocated-encoder encodes media in this process: drop --encoders, or drop "
                "--colocated-encoder to fetch rows from those encoders"
            )
        if config.colocated_encoder and config.encoders_share_cpus:
            raise SystemExit(
                "--encoders-share-cpus is for encoder services: a --colocated-encoder "
                "computes on the decoder's compute thread, between its forwards"
            )
        if config.block_size < 1 or config.kv_cache_bytes < 1:
            raise SystemExit("--block-size and --kv-cache-bytes must be positive")
        if not 0 <= config.kv_cache_memory_fraction < 1:
            raise SystemExit(
                "--kv-cache-memory-fraction must be in [0, 1) (0: size by --kv-cache-bytes), "
                f"got {config.kv_cache_memory_fraction:g}"
            )
        return config


def add_decoder_flags(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    add_served_model_name_flag(parser)
    add_metrics_flag(parser)
    add_common_flags(parser, default_port=50053)
    add_tls_flags(parser)
    add_allow_callers_flag(parser, DECODER_ACCESS)
    add_address_flag(
        parser,
        "--encoders",
        "TESSERA_ENCODERS",
        "the encoders to fetch embedding rows from, host:port[,...] or dns:///name:port for "
        "every address of a name; the only ones this decoder dials (a request's encoder "
        "addresses are hints among them). Without it, requests with media are refused",
        required=False,
    )
    add_replica_flags(parser)
    parser.add_argument(
        "--max-chunk-tokens", type=int, default=512, help="largest prefill chunk, in tokens"
    )
    parser.add_argument("--max-num-seqs", type=int, default=8, help="most requests running at once")
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="token budget of one engine step (decodes first, then prefill chunks)",
    )
    parser.add_argument(
        "--max-prefill-tokens-per-step",
        type=int,
        default=0,
        help="most prompt tokens one step prefills (0: --max-chunk-tokens); the prompt "
        "closest to its first token goes first, and the first chunk always runs. It bounds "
        "the running requests' inter-token latency while prompts arrive",
    )
    parser.add_argument(
        "--max-prefills-per-step",
        type=int,
        default=0,
        help="most prompts that get a prefill chunk in one step (0: as many as "
        "--max-prefill-tokens-per-step holds)",
    )
    parser.add_argument(
        "--max-prefill-age-steps",
        type=int,
        default=64,
        help="a prompt running longer than this many steps goes before younger prompts "
        "(oldest first), however long it is, so none starves",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest prompt + output (default: the model's context length)",
    )
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=256,
        help="max tokens of a request that names none (clamped to the context left)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed message after the first, which goes out alone: above 1, "
        "fewer and larger messages on every hop to the client (less CPU per token, more "
        "throughput where the services share cores) for a burstier stream",
    )
    parser.add_argument(
        "--fetch-timeout-seconds",
        type=float,
        default=60.0,
        help="deadline of one embedding fetch or re-encode call",
    )
    parser.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=1 << 30,
        help="memory for the paged KV cache; the number of blocks is logged at start",
    )
    parser.add_argument(
        "--kv-cache-memory-fraction",
        type=float,
        default=0.0,
        help="if > 0, size the KV cache as this fraction of the device's total memory "
        "instead of --kv-cache-bytes",
    )
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    parser.add_argument(
        "--decode-kv-mirror-bytes",
        type=int,
        default=None,
        help="memory for a contiguous copy of the decoding requests' keys and values, "
        "updated one token a step, so that a step does not gather every context from the "
        "paged cache; the rows of a batch that do not fit are gathered (0: always gather; "
        "default: a quarter of the KV cache's memory)",
    )
    parser.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse KV blocks of earlier requests with the same prefix (text and media)",
    )
    parser.add_argument(
        "--adapt-torch-threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on a CPU, run each forward on one torch thread per CPU the rest of the host "
        "leaves free (re-decided every 0.2 s, at most --torch-threads): another process's "
        "busy CPU otherwise stalls every op at its barrier",
    )
    parser.add_argument(
        "--encoders-share-cpus",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the encoders run on this host's CPUs: with --adapt-torch-threads, forwards "
        "run on one torch thread while they compute items this decoder fetches (an "
        "encoder's threads starting mid-forward stall it at every op; default: when every "
        "--encoders address is a loopback address or localhost)",
    )
    parser.add_argument(
        "--linear-kernel",
        choices=LINEAR_KERNELS,
        default=env_default("TESSERA_LINEAR_KERNEL", AUTO, _linear_kernel),
        help="on a CPU in float32, what runs the language model's linear layers: torch's "
        "matmul, oneDNN with each weight packed once at load, or auto: both timed on each "
        "weight shape at load, oneDNN where it is faster on this host (docs/benchmarks.md); "
        "the two differ only in the last bits (env TESSERA_LINEAR_KERNEL)",
    )
    parser.add_argument(
        "--max-prefetch-bytes",
        type=int,
        default=256 << 20,
        help="embedding rows fetched ahead of the forward, at most (over all requests)",
    )
    parser.add_argument(
        "--fetch-mode",
        choices=["slice", "whole"],
        default="slice",
        help="slice: fetch only the rows a chunk needs; whole: fetch each overlapping item's "
        "whole embedding for every chunk (a baseline for benchmarks; output is the same)",
    )
    parser.add_argument(
        "--colocated-encoder",
        action="store_true",
        help="run the media encoder in this process (as vLLM v1 does), with its own memory "
        "cache, instead of fetching rows from encoder services; --encoders is then not used",
    )
    parser.add_argument(
        "--colocated-cache-bytes",
        type=int,
        default=1 << 30,
        help="memory cache of encoder outputs with --colocated-encoder",
    )
    parser.add_argument(
        "--lease-ms",
        type=int,
        default=60_000,
        help="how long encoders pin an item for a request (renewed on every fetch)",
    )
