"""The encoder's core: compute each item once, cache it, serve row ranges of it.

Single-flight: the first request for a content hash computes it; any request for the same
hash that arrives meanwhile (an Encode, or a slice request from a decoder) waits on the
same future instead of computing again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum

from encoder_service.memory_store import Lease, MemoryStore
from tessera.adapters import ModelFamily
from tessera.hashing import is_content_hash
from tessera.media import DecodedImage, MediaError, decode_image
from tessera.placeholders import Modality
from tessera.tensor_codec import RowBlock, encode_rows

log = logging.getLogger("tessera.encoder")


class InvalidItemError(ValueError):
    """An item the encoder cannot take (bad bytes, wrong modality, hash mismatch)."""


class UnknownItemError(LookupError):
    """A slice request names an item this encoder does not have."""


class Source(Enum):
    COMPUTED = "computed"
    MEMORY = "memory"
    JOINED = "joined"


@dataclass(frozen=True)
class EncodeItem:
    content_hash: str
    modality: Modality
    data: bytes


@dataclass(frozen=True)
class EncodeResult:
    content_hash: str
    block: RowBlock
    source: Source


@dataclass(frozen=True)
class RowRequest:
    """Rows `[start, end)` of one item."""

    content_hash: str
    start: int
    end: int


@dataclass
class EncoderCounters:
    num_items_requested: int = 0
    num_items_computed: int = 0
    num_memory_hits: int = 0
    num_joined_in_flight: int = 0
    num_slice_misses: int = 0
    num_bytes_served: int = 0
    num_batches: int = 0


@dataclass
class _Batch:
    items: list[EncodeItem] = field(default_factory=list)
    futures: list[asyncio.Future[RowBlock]] = field(default_factory=list)


class EncoderCore:
    def __init__(
        self,
        family: ModelFamily,
        store: MemoryStore,
        max_batch_items: int,
        max_image_pixels: int,
    ):
        self.family = family
        self.store = store
        self.max_batch_items = max_batch_items
        self.max_image_pixels = max_image_pixels
        self.counters = EncoderCounters()
        self._in_flight: dict[str, asyncio.Future[RowBlock]] = {}
        # One model thread: concurrent forwards would only fight over the same cores.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")

    async def encode(self, items: Sequence[EncodeItem], lease: Lease | None) -> list[EncodeResult]:
        """Rows for every item, computing only those neither cached nor in flight."""
        for item in items:
            self._check_item(item)
        self.counters.num_items_requested += len(items)
        sources: dict[str, Source] = {}
        waits: dict[str, asyncio.Future[RowBlock]] = {}
        batch = _Batch()
        for item in items:
            if item.content_hash in sources:
                continue
            if self.store.get(item.content_hash, lease) is not None:
                sources[item.content_hash] = Source.MEMORY
                self.counters.num_memory_hits += 1
            elif item.content_hash in self._in_flight:
                sources[item.content_hash] = Source.JOINED
                waits[item.content_hash] = self._in_flight[item.content_hash]
                self.counters.num_joined_in_flight += 1
            else:
                sources[item.content_hash] = Source.COMPUTED
                future = asyncio.get_running_loop().create_future()
                self._in_flight[item.content_hash] = future
                waits[item.content_hash] = future
                batch.items.append(item)
                batch.futures.append(future)
        if batch.items:
            await self._compute(batch, lease)
        blocks = {name: await future for name, future in waits.items()}
        for name, block in blocks.items():
            # put() re-inserts an entry that was evicted between compute and now.
            self.store.put(name, block, lease)
        return [
            EncodeResult(
                item.content_hash,
                blocks.get(item.content_hash) or self.store.get(item.content_hash),
                sources[item.content_hash],
            )
            for item in items
        ]

    async def resolve_slices(
        self, requests: Sequence[RowRequest], lease: Lease | None
    ) -> list[RowBlock]:
        """The rows of each request, after an encode in flight finishes if need be.

        Raises UnknownItemError for an item neither cached nor in flight, ValueError for
        rows outside the item; nothing is streamed until every request is resolved.
        """
        blocks = []
        for request in requests:
            if not is_content_hash(request.content_hash):
                raise ValueError(f"{request.content_hash!r} is not a content hash")
            block = self.store.get(request.content_hash, lease)
            if block is None and request.content_hash in self._in_flight:
                block = await self._in_flight[request.content_hash]
                self.store.put(request.content_hash, block, lease)
            if block is None:
                self.counters.num_slice_misses += 1
                raise UnknownItemError(
                    f"item {request.content_hash} is not on this encoder; Encode it first"
                )
            if not 0 <= request.start < request.end <= block.num_rows:
                raise ValueError(
                    f"rows [{request.start}, {request.end}) are outside item "
                    f"{request.content_hash}, which has rows [0, {block.num_rows})"
                )
            blocks.append(block.rows(request.start, request.end))
        return blocks

    def release(self, owner: str, content_hashes: Sequence[str] | None) -> int:
        return self.store.release(owner, content_hashes)

    def _check_item(self, item: EncodeItem) -> None:
        if not is_content_hash(item.content_hash):
            raise InvalidItemError(
                f"{item.content_hash!r} is not a content hash (64 lowercase hex characters)"
            )
        if item.modality not in self.family.modalities:
            raise InvalidItemError(
                f"this model takes {sorted(m.value for m in self.family.modalities)}, "
                f"not {item.modality.value}"
            )

    async def _compute(self, batch: _Batch, lease: Lease | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            for start in range(0, len(batch.items), self.max_batch_items):
                items = batch.items[start : start + self.max_batch_items]
                futures = batch.futures[start : start + self.max_batch_items]
                outcomes = await loop.run_in_executor(self._model_thread, self._encode_batch, items)
                self.counters.num_batches += 1
                for item, future, outcome in zip(items, futures, outcomes, strict=True):
                    if isinstance(outcome, Exception):
                        future.set_exception(outcome)
                    else:
                        self.counters.num_items_computed += 1
                        self.store.put(item.content_hash, outcome, lease)
                        future.set_result(outcome)
        except BaseException as error:  # the model failed: every waiter must hear of it
            for future in batch.futures:
                if not future.done():
                    future.set_exception(RuntimeError(f"encoding failed: {error}"))
            raise
        finally:
            for item in batch.items:
                self._in_flight.pop(item.content_hash, None)
            for future in batch.futures:
                # Joiners retrieve errors; this keeps asyncio from logging them twice.
                if future.done() and not future.cancelled():
                    future.exception()

    def _encode_batch(self, items: Sequence[EncodeItem]) -> list[RowBlock | Exception]:
        """Runs on the model thread: decode, verify each hash, one forward for the rest."""
        outcomes: list[RowBlock | Exception] = []
        decoded: list[tuple[int, DecodedImage]] = []
        for index, item in enumerate(items):
            try:
                image = decode_image(item.data, self.max_image_pixels)
            except MediaError as error:
                outcomes.append(InvalidItemError(str(error)))
                continue
            actual = image.content_hash(self.family.fingerprint)
            if actual != item.content_hash:
                outcomes.append(
                    InvalidItemError(
                        f"content hash {item.content_hash} does not match the item's content "
                        f"({actual}); do the gateway and encoder serve the same model?"
                    )
                )
                continue
            outcomes.append(InvalidItemError("not encoded"))  # replaced below
            decoded.append((index, image))
        if decoded:
            rows = self.family.encode([image for _, image in decoded])
            for (index, _), tensor in zip(decoded, rows, strict=True):
                outcomes[index] = encode_rows(tensor)
        return outcomes
