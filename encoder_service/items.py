"""What the encoder's core takes and gives: items to encode, row requests, where rows came
from, its counters, the L2 store it may share with other replicas, and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import torch

from tessera.media import ProcessingOptions
from tessera.placeholders import Modality
from tessera.tensor_codec import RowBlock
from tessera.video import DecodedVideo


class InvalidItemError(ValueError):
    """An item the encoder cannot take (bad bytes, wrong modality, hash mismatch)."""


class UnknownItemError(LookupError):
    """A slice request names an item this encoder cannot find anywhere."""


class Source(Enum):
    COMPUTED = "computed"
    MEMORY = "memory"
    JOINED = "joined"
    REDIS = "redis"


@dataclass(frozen=True)
class EncodeItem:
    content_hash: str
    modality: Modality
    data: bytes
    options: ProcessingOptions = field(default_factory=ProcessingOptions)
    cache_salt: str = ""  # the tenant salt `content_hash` was made with
    # From a caller trusted with hashes (encoder_service.hash_trust): not checked.
    hash_trusted: bool = False
    # A video decoded before it was queued (off the model thread); None: decode in batch.
    decoded: DecodedVideo | None = field(default=None, compare=False)
    # An image's pixel values from a caller trusted with hashes (processed_pixels.py):
    # the tower runs on them and `data` is not decoded.
    pixel_values: torch.Tensor | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.pixel_values is not None and not self.hash_trusted:
            # Rows made from them are filed under the caller's hash, unchecked.
            raise ValueError("pixel values are taken only from a caller trusted with hashes")


@dataclass(frozen=True)
class EncodeResult:
    content_hash: str
    block: RowBlock
    source: Source


@dataclass(frozen=True)
class RowRequest:
    """Rows `[start, end)` of one item, which the caller expects to have `item_num_rows`
    rows (0: unchecked)."""

    content_hash: str
    start: int
    end: int
    item_num_rows: int = 0


@dataclass
class EncoderCounters:
    num_items_requested: int = 0
    num_items_computed: int = 0
    num_memory_hits: int = 0
    num_redis_hits: int = 0
    num_joined_in_flight: int = 0
    num_remote_waits: int = 0
    num_slice_misses: int = 0
    num_bytes_served: int = 0
    num_hashes_verified: int = 0
    num_hashes_trusted: int = 0
    num_pixel_values_used: int = 0
    num_pixel_values_ignored: int = 0
    num_slice_calls: int = 0
    num_expedite_calls: int = 0  # that named an item in flight
    num_expedited_batches: int = 0


class SharedStore(Protocol):
    """The L2 cache shared by replicas (encoder_service.redis_store.RedisStore)."""

    async def get(self, content_hash: str) -> RowBlock | None: ...
    async def get_rows(self, content_hash: str, start: int, end: int) -> RowBlock | None: ...
    async def put(self, content_hash: str, block: RowBlock) -> bool: ...
    async def try_lease(self, content_hash: str, owner: str, ttl_ms: int) -> bool: ...
    async def release_lease(self, content_hash: str, owner: str) -> None: ...
    async def renew_lease(self, content_hash: str, owner: str, ttl_ms: int) -> bool: ...
    async def wait_for(self, content_hash: str, timeout_s: float) -> bool: ...
    def known_num_rows(self, content_hash: str) -> int | None: ...


@dataclass(frozen=True)
class FleetSettings:
    """How this replica coordinates with the others through the shared store."""

    replica_id: str
    compute_lease_ms: int
    remote_wait_seconds: float
