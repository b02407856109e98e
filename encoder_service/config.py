"""The encoder's settings, built once from flags (and environment defaults) and passed down."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from encoder_service.hash_trust import add_trust_flag
from tessera.access import ANY_CALLER, AccessRules, add_allow_callers_flag, rules_from_args
from tessera.config_common import (
    Secret,
    add_common_flags,
    add_model_flags,
    config_from_args,
    env_default,
)
from tessera.media_decoder import MediaLimits, add_media_limit_flags
from tessera.metrics import add_metrics_flag
from tessera.tls import TlsFiles, add_tls_flags

if TYPE_CHECKING:  # imported where used: it brings torch, which parsing flags needs not
    from encoder_service.memory_store import PinLimits

# 16 images of 1024x1024, or one of 4096x4096, per forward: big enough to batch every
# image a chat sends, small enough that a request of huge images runs as many batches
# and other requests' items take turns between them.
DEFAULT_MAX_BATCH_PIXELS = 1 << 24
# Items per forward when --max-batch-items is not given. An accelerator runs a batch in
# about the time of one item, so it batches. A CPU's forward costs each item the same
# whether alone or batched, so a batch only holds back its first items until its last is
# done, and the decoder waiting for the first image waits for all of them (benchmarks:
# "One image per forward on a CPU").
DEFAULT_MAX_BATCH_ITEMS = {"cpu": 1, "accelerator": 16}

# Gateways encode a request's items; decoders re-encode one an encoder lost. Both fetch
# rows and release leases. Decoders say when they idle for items (Expedite).
ENCODER_ACCESS = AccessRules(
    "tessera.v1.EncoderService",
    {
        "Encode": frozenset({"gateway", "decoder"}),
        "GetEmbeddingSlices": frozenset({"decoder", "gateway"}),
        "GetEmbeddingRows": frozenset({"decoder", "gateway"}),
        "ReleaseLeases": frozenset({"decoder", "gateway"}),
        "Expedite": frozenset({"decoder"}),
        "GetStats": frozenset({ANY_CALLER}),
    },
)


@dataclass(frozen=True)
class EncoderConfig:
    model: str
    host: str
    port: int
    device: str
    dtype: str
    cache_bytes: int
    max_pinned_bytes: int | None
    max_pinned_bytes_per_owner: int | None
    default_lease_ms: int
    max_lease_ms: int
    max_slices_per_call: int
    max_slice_bytes_per_call: int
    max_batch_items: int
    max_batch_wait_ms: float
    max_batch_pixels: int
    redis_url: str | None
    redis_cluster: bool
    redis_username: str | None
    redis_password_file: str | None
    # From TESSERA_REDIS_PASSWORD (there is no flag: argv shows in `ps`).
    redis_password: Secret | None
    redis_tls_ca_file: str | None
    redis_tls_cert_file: str | None
    redis_tls_key_file: str | None
    cache_mac_key_file: str | None
    redis_ttl_seconds: float
    redis_timeout_seconds: float
    redis_max_connections: int
    compute_lease_ms: int
    remote_wait_seconds: float
    replica_id: str | None
    media_limits: MediaLimits
    slice_message_bytes: int
    drain_seconds: float
    model_fingerprint: str | None
    log_level: str
    log_format: str
    metrics_port: int
    tls: TlsFiles
    access: AccessRules
    # Certificate names whose content hashes are taken as given (mutual TLS only).
    trust_content_hashes_from: frozenset[str]
    enable_reflection: bool
    health_port: int
    torch_threads: int = 0  # --torch-threads (0: torch's default)
    expedite_torch_threads: int = 0  # 0: one per usable CPU

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EncoderConfig:
        return config_from_args(
            cls,
            args,
            max_batch_items=max_batch_items(args.max_batch_items, args.device),
            media_limits=MediaLimits.from_args(args),
            tls=TlsFiles.from_args(args),
            access=rules_from_args(args, ENCODER_ACCESS),
        )

    def pin_limits(self) -> PinLimits:
        """The flags' pin bounds, each defaulting to its fraction of --cache-bytes."""
        from encoder_service.memory_store import PinLimits

        default = PinLimits.of_budget(self.cache_bytes)
        return PinLimits(
            default.max_pinned_bytes if self.max_pinned_bytes is None else self.max_pinned_bytes,
            default.max_bytes_per_owner
            if self.max_pinned_bytes_per_owner is None
            else self.max_pinned_bytes_per_owner,
        )


def max_batch_items(flag: int | None, device: str) -> int:
    """--max-batch-items, else the default for the device's kind.

    Example: max_batch_items(None, "cpu") == 1; max_batch_items(None, "cuda:1") == 16.
    """
    if flag is not None:
        return flag
    kind = "cpu" if device == "cpu" else "accelerator"
    return DEFAULT_MAX_BATCH_ITEMS[kind]


def add_encoder_flags(parser: argparse.ArgumentParser) -> None:
    add_model_flags(parser)
    add_metrics_flag(parser)
    add_common_flags(parser, default_port=50052)
    add_tls_flags(parser)
    add_allow_callers_flag(parser, ENCODER_ACCESS)
    add_trust_flag(parser)
    parser.add_argument(
        "--cache-bytes",
        type=int,
        default=env_default("TESSERA_ENCODER_CACHE_BYTES", 2 << 30, int),
        help="memory cache budget in bytes",
    )
    parser.add_argument(
        "--max-pinned-bytes",
        type=int,
        default=None,
        help="most cache bytes all leases together may pin (default: 3/4 of --cache-bytes); "
        "an item past it is still served, only evictable",
    )
    parser.add_argument(
        "--max-pinned-bytes-per-owner",
        type=int,
        default=None,
        help="most cache bytes one lease owner (a request) may pin (default: 1/8 of --cache-bytes)",
    )
    parser.add_argument(
        "--default-lease-ms",
        type=int,
        default=60_000,
        help="how long an Encode pins its items when the caller names no lease length",
    )
    parser.add_argument(
        "--max-lease-ms",
        type=int,
        default=300_000,
        help="longest pin a caller may ask for (longer leases are refused)",
    )
    parser.add_argument(
        "--max-slices-per-call",
        type=int,
        default=1024,
        help="most row slices one GetEmbeddingSlices or GetEmbeddingRows call may ask for",
    )
    parser.add_argument(
        "--max-slice-bytes-per-call",
        type=int,
        default=256 << 20,
        help="most embedding bytes one GetEmbeddingSlices or GetEmbeddingRows call may ask for",
    )
    parser.add_argument(
        "--max-batch-items",
        type=int,
        default=None,
        help="most items in one encoder forward (default: 1 on a CPU, where batching saves "
        "nothing and delays the first items; 16 on an accelerator)",
    )
    parser.add_argument(
        "--max-batch-pixels",
        type=int,
        default=DEFAULT_MAX_BATCH_PIXELS,
        help="most image pixels in one encoder forward (one larger image runs alone); "
        "callers' items take turns between forwards (0: no bound)",
    )
    parser.add_argument(
        "--max-batch-wait-ms",
        type=float,
        default=2.0,
        help="how long a batch waits for more items after its first one",
    )
    parser.add_argument(
        "--expedite-torch-threads",
        type=int,
        default=0,
        help="torch threads for a batch a decoder idles for (it says so: Expedite), where "
        "--torch-threads leaves CPUs to decoders on the same host (0: one per CPU the "
        "process may use; a value at most --torch-threads never widens)",
    )
    parser.add_argument(
        "--redis-url",
        default=env_default("TESSERA_REDIS_URL", None),
        help="shared L2 cache, e.g. redis://redis:6379/0 (off by default; env TESSERA_REDIS_URL)",
    )
    parser.add_argument(
        "--redis-cluster", action="store_true", help="--redis-url names a Redis Cluster node"
    )
    add_redis_security_flags(parser)
    parser.add_argument(
        "--redis-ttl-seconds", type=float, default=3600.0, help="expiry of every cached item"
    )
    parser.add_argument(
        "--redis-timeout-seconds",
        type=float,
        default=0.5,
        help="deadline of one Redis call; slower means unreachable (serve without it)",
    )
    parser.add_argument("--redis-max-connections", type=int, default=32)
    parser.add_argument(
        "--compute-lease-ms",
        type=int,
        default=2_000,
        help="length of the fleet-wide right to compute an item, renewed every third of it "
        "while computing (a replica that dies frees its items within this long)",
    )
    parser.add_argument(
        "--remote-wait-seconds",
        type=float,
        default=10.0,
        help="how long to wait for another replica's computation before computing here",
    )
    parser.add_argument(
        "--replica-id", default=None, help="name in compute leases (default: host:port)"
    )
    add_media_limit_flags(parser)
    parser.add_argument(
        "--slice-message-bytes",
        type=int,
        default=1 << 20,
        help="target size of each streamed slice message",
    )


def add_redis_security_flags(parser: argparse.ArgumentParser) -> None:
    """Who the encoder is to Redis, over what, and the key that authenticates entries.
    Secrets come from files or the environment, never from argv."""
    parser.add_argument(
        "--redis-username", default=None, help="Redis ACL user (default: the default user)"
    )
    parser.add_argument(
        "--redis-password-file",
        default=None,
        help="file holding the Redis password (e.g. a mounted Secret); or set env "
        "TESSERA_REDIS_PASSWORD. Keep passwords out of --redis-url: argv shows in `ps`",
    )
    parser.set_defaults(redis_password=env_default("TESSERA_REDIS_PASSWORD", None, Secret))
    parser.add_argument(
        "--redis-tls-ca-file",
        default=None,
        help="CA certificate that signed the Redis server's (rediss:// URLs)",
    )
    parser.add_argument(
        "--redis-tls-cert-file",
        default=None,
        help="client certificate for Redis servers that check clients (tls-auth-clients)",
    )
    parser.add_argument(
        "--redis-tls-key-file", default=None, help="the client certificate's private key"
    )
    parser.add_argument(
        "--cache-mac-key-file",
        default=env_default("TESSERA_CACHE_MAC_KEY_FILE", None),
        help="secret shared by every encoder (>= 32 bytes, e.g. `openssl rand -hex 32`): "
        "Redis entries carry keyed MACs and an entry without a valid one is recomputed, "
        "never served. Without it entries have unkeyed checksums, which anyone who can "
        "write to Redis can forge (env TESSERA_CACHE_MAC_KEY_FILE)",
    )
