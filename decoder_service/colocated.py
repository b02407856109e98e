"""The media encoder inside the decoder's process (`tessera decoder --colocated-encoder`).

This is how vLLM v1 runs multimodal models by default: the vision or audio tower runs in
the engine's process, on the same device and thread as the language model, with a local
cache of encoder outputs. Tessera keeps it as a deployment of its own, to measure when
disaggregation pays off (docs/benchmarks.md) and for single-host installs: no encoder
service, no Redis, the rows never cross a socket. The decoder's fetches ask this
encoder instead of the network; a row range still comes out exactly as the chunk needs.

The same `EncoderCore` as the encoder service runs here (memory cache with per-request
pins, batching, single flight), on the decoder's compute thread: while the tower
computes, no forward runs, as in vLLM v1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoder_service.embedding_client import FetchError, ItemRefusedError
from decoder_service.request import MediaSource
from encoder_service.config import max_batch_items
from encoder_service.encoder import EncoderCore
from encoder_service.items import EncodeItem, RowRequest, UnknownItemError
from encoder_service.memory_store import Lease, MemoryStore, PinLimits
from tessera.adapters import ModelFamily
from tessera.media_decoder import MediaLimits
from tessera.placeholders import ChunkSlice
from tessera.tensor_codec import decode_rows

# No waiting for more items: the tower runs as soon as the decoder asks.
MAX_BATCH_WAIT_MS = 0.0


@dataclass(frozen=True)
class LocalRows:
    rows: torch.Tensor  # [num_rows, row_width] on CPU
    num_bytes: int
    encoded: bool  # this fetch had the item encoded


class ColocatedEncoder:
    def __init__(self, family: ModelFamily, cache_bytes: int, lease_ms: int, device: str):
        self.core = EncoderCore(
            family,
            MemoryStore(cache_bytes, PinLimits.of_budget(cache_bytes)),
            max_batch_items(None, device),  # the encoder service's default for the device
            MAX_BATCH_WAIT_MS,
            MediaLimits(),
        )
        self.lease_seconds = lease_ms / 1000

    async def rows(self, request_id: str, item: MediaSource, chunk_slice: ChunkSlice) -> LocalRows:
        """Rows `[row_start, row_end)` of the item, encoding it first if this process
        does not hold it (evicted, or never seen)."""
        lease = Lease(request_id, self.lease_seconds)
        wanted = RowRequest(
            chunk_slice.content_hash,
            chunk_slice.row_start,
            chunk_slice.row_end,
            item.range.num_item_rows,
        )
        encoded = False
        try:
            try:
                (block,) = await self.core.resolve_slices([wanted], lease)
            except UnknownItemError:
                await self._encode(item, lease)
                encoded = True
                (block,) = await self.core.resolve_slices([wanted], lease)
        except UnknownItemError:  # encoded, then evicted before it was read
            raise FetchError(
                f"item {wanted.content_hash} was evicted right after encoding: the "
                "colocated encoder's cache is too small for the requests in flight"
            ) from None
        except ValueError as error:  # the item itself: bad bytes, rows outside it
            raise ItemRefusedError(f"item {wanted.content_hash}: {error}") from None
        rows = decode_rows(block.dtype, (block.num_rows, block.hidden_size), block.data)
        return LocalRows(rows, len(block.data), encoded)

    async def _encode(self, item: MediaSource, lease: Lease) -> None:
        source = EncodeItem(
            item.range.content_hash,
            item.range.modality,
            item.data,
            item.options,
            item.cache_salt,
        )
        await self.core.encode([source], lease)

    def release(self, owner: str) -> None:
        """The request no longer needs its items pinned."""
        self.core.release(owner, None)
