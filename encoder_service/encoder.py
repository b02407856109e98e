"""The encoder's core: compute each item once across the fleet, cache it, serve row
ranges of it.

Where an item's rows come from, in order: this replica's memory (L1); a computation
already running here (single-flight: every request for the hash awaits the same task);
Redis (L2, shared by every replica); a computation on another replica (a short Redis
lease says one is running: wait for its result, up to a timeout); finally computing it
here, batched with whatever else is being encoded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from encoder_service.batcher import Batcher
from encoder_service.config import DEFAULT_MAX_BATCH_PIXELS
from encoder_service.expedite import Expediter, TowerThreads
from encoder_service.items import (
    EncodeItem,
    EncoderCounters,
    EncodeResult,
    FleetSettings,
    InvalidItemError,
    RowRequest,
    SharedStore,
    Source,
    UnknownItemError,
)
from encoder_service.memory_store import Lease, MemoryStore
from tessera.adapters import MediaInput, ModelFamily
from tessera.adapters.base import ProcessedImage
from tessera.audio import DecodedAudio
from tessera.hashing import is_content_hash, salted_hash
from tessera.media import DecodedImage
from tessera.media_decoder import MediaDecoder, MediaLimits
from tessera.placeholders import Modality
from tessera.tensor_codec import RowBlock, encode_rows
from tessera.video import MAX_CONCURRENT_VIDEO_DECODES, DecodedVideo

log = logging.getLogger("tessera.encoder")


class EncoderCore:
    def __init__(
        self,
        family: ModelFamily,
        store: MemoryStore,
        max_batch_items: int,
        max_batch_wait_ms: float,
        limits: MediaLimits,
        shared: SharedStore | None = None,
        fleet: FleetSettings | None = None,
        max_batch_pixels: int = DEFAULT_MAX_BATCH_PIXELS,
        threads: TowerThreads | None = None,
    ):
        self.family = family
        self.store = store
        self.decoder = MediaDecoder.for_family(family, limits)
        self.shared = shared
        self.fleet = fleet or FleetSettings("local", 2_000, 10.0)
        self.counters = EncoderCounters()
        self.batcher: Batcher[EncodeItem, RowBlock] = Batcher(
            self._run_batch,
            max_batch_items,
            max_batch_wait_ms,
            cost=self._batch_cost,
            max_batch_cost=max_batch_pixels,
            on_batch_start=self._batch_started,
            on_batch_end=self._batch_ended,
        )
        # Without `threads` the batches keep the compute thread's threads.
        self.expediter = Expediter(threads or TowerThreads.unchanged(), self.batcher.hurry)
        self._in_flight: dict[str, asyncio.Task[tuple[RowBlock, Source]]] = {}
        self._video_decoding = ThreadPoolExecutor(
            max_workers=MAX_CONCURRENT_VIDEO_DECODES, thread_name_prefix="video"
        )

    async def encode(self, items: Sequence[EncodeItem], lease: Lease | None) -> list[EncodeResult]:
        """Rows for every item; each unique item is looked up or computed once. Items
        this call computes queue under its lease owner (or the call itself, without one)
        and take turns with other callers' items."""
        return await self.begin_encode(items, lease)

    def begin_encode(
        self, items: Sequence[EncodeItem], lease: Lease | None
    ) -> asyncio.Future[list[EncodeResult]]:
        """`encode`, split where it first waits: on return every item is in memory or in
        flight here (a slice request arriving now finds it), and the awaitable gives the
        rows. Raises InvalidItemError at once for items refused before any work."""
        for item in items:
            self._check_item(item)
        self.counters.num_items_requested += len(items)
        unique = list({item.content_hash: item for item in items}.values())
        try:
            self.decoder.check_request_pixels((item.modality, item.data) for item in unique)
        except ValueError as error:
            raise InvalidItemError(str(error)) from None
        # Every lookup starts before the first await, so a slice request arriving right
        # behind this Encode finds the computation in flight; items that need computing
        # then share one batch.
        caller = lease.owner if lease else object()
        pending = [self._start(item, lease, caller) for item in unique]
        return asyncio.ensure_future(self._results(items, unique, pending))

    @staticmethod
    async def _results(
        items: Sequence[EncodeItem], unique: list[EncodeItem], pending: list[asyncio.Future]
    ) -> list[EncodeResult]:
        found = await asyncio.gather(*pending)
        outcomes = {item.content_hash: outcome for item, outcome in zip(unique, found, strict=True)}
        return [EncodeResult(i.content_hash, *outcomes[i.content_hash]) for i in items]

    def _start(self, item: EncodeItem, lease: Lease | None, caller: Hashable) -> asyncio.Future:
        """A future of (rows, source) for one item; never waits."""
        name = item.content_hash
        block = self.store.get(name, lease)
        if block is not None:
            self.counters.num_memory_hits += 1
            done = asyncio.get_running_loop().create_future()
            done.set_result((block, Source.MEMORY))
            return done
        task = self._in_flight.get(name)
        if task is not None:
            self.counters.num_joined_in_flight += 1
            return asyncio.ensure_future(self._join(item, task, lease, caller))
        task = asyncio.create_task(self._resolve(item, caller))
        self._in_flight[name] = task
        task.add_done_callback(self._forget)
        return asyncio.ensure_future(self._finish(name, task, lease, None))

    async def _finish(
        self, name: str, task: asyncio.Task, lease: Lease | None, source: Source | None
    ) -> tuple[RowBlock, Source]:
        # Shielded: a cancelled request must not cancel a computation others share.
        block, resolved = await asyncio.shield(task)
        # put() re-inserts an entry evicted since, and pins it for this request.
        self.store.put(name, block, lease)
        return block, source or resolved

    async def _join(
        self, item: EncodeItem, task: asyncio.Task, lease: Lease | None, caller: Hashable
    ) -> tuple[RowBlock, Source]:
        """The computation in flight for this hash, unless it fails for its own bytes (a
        caller that named this hash for other content): then this item's own bytes are
        encoded, so one hostile caller cannot fail everyone who asked for the item."""
        try:
            return await self._finish(item.content_hash, task, lease, Source.JOINED)
        except InvalidItemError:
            if self._in_flight.get(item.content_hash) is task:
                del self._in_flight[item.content_hash]
            return await self._start(item, lease, caller)

    def _forget(self, task: asyncio.Task) -> None:
        for name, running in list(self._in_flight.items()):
            if running is task:
                del self._in_flight[name]
        if not task.cancelled():
            task.exception()  # retrieved: waiters that were cancelled will not see it

    async def _resolve(self, item: EncodeItem, caller: Hashable) -> tuple[RowBlock, Source]:
        """Runs once per content hash at a time on this replica."""
        name = item.content_hash
        shared, fleet = self.shared, self.fleet
        if shared is None:
            return await self._compute(item, caller), Source.COMPUTED
        block = await shared.get(name)
        if block is None:
            if await shared.try_lease(name, fleet.replica_id, fleet.compute_lease_ms):
                # The replica that computed it may have put it and released its lease
                # between the read above and this lease: read again before computing.
                block = await shared.get(name)
                if block is not None:
                    await shared.release_lease(name, fleet.replica_id)
            else:
                # Another replica is computing it: its result will land in the shared store.
                self.counters.num_remote_waits += 1
                if await shared.wait_for(name, fleet.remote_wait_seconds):
                    block = await shared.get(name)
        if block is not None:
            self.counters.num_redis_hits += 1
            self.store.put(name, block)
            return block, Source.REDIS
        renewal = asyncio.create_task(self._keep_lease(name))
        try:
            block = await self._compute(item, caller)
            await shared.put(name, block)
        finally:
            renewal.cancel()
            await shared.release_lease(name, fleet.replica_id)
        return block, Source.COMPUTED

    async def _keep_lease(self, name: str) -> None:
        """Renews the compute lease every third of its length while this replica computes:
        a replica that dies mid-compute leaves a lease that ends within one length (2 s
        by default), so the others wait about that long for it, not the whole
        --remote-wait-seconds."""
        shared, fleet = self.shared, self.fleet
        while True:
            await asyncio.sleep(fleet.compute_lease_ms / 3000)
            if not await shared.renew_lease(name, fleet.replica_id, fleet.compute_lease_ms):
                return  # not ours (expired, or Redis is down): nothing to keep

    async def _compute(self, item: EncodeItem, caller: Hashable) -> RowBlock:
        if item.modality == Modality.VIDEO:
            # Seconds of demuxing and decoding: on threads of their own, so the model
            # thread keeps encoding other callers' items meanwhile.
            loop = asyncio.get_running_loop()
            try:
                decoded = await loop.run_in_executor(
                    self._video_decoding,
                    self.decoder.decode,
                    item.modality,
                    item.data,
                    item.options,
                )
            except ValueError as error:
                raise InvalidItemError(str(error)) from None
            item = replace(item, decoded=decoded)
        block = await self.batcher.submit(item, caller)
        self.counters.num_items_computed += 1
        self.store.put(item.content_hash, block)
        return block

    async def resolve_slices(
        self, requests: Sequence[RowRequest], lease: Lease | None, max_bytes: int | None = None
    ) -> list[RowBlock]:
        """The rows of each request: from memory, an encode in flight, or Redis (only the
        rows asked for). Raises UnknownItemError for an item found nowhere, ValueError for
        rows outside the item or past `max_bytes` in all; nothing is streamed until every
        request is resolved, so the bound holds for what the call materialises (and
        twice it for what it keeps alive: `_served_rows`). A block's data may be a view."""
        blocks = []
        num_bytes = 0
        for request in requests:
            if not is_content_hash(request.content_hash):
                raise ValueError(f"{request.content_hash!r} is not a content hash")
            if request.start >= request.end:
                raise ValueError(f"rows [{request.start}, {request.end}) are empty")
            block = await self._rows(request, lease)
            num_bytes += len(block.data)
            if max_bytes is not None and num_bytes > max_bytes:
                raise ValueError(
                    f"the slices ask for more than {max_bytes} bytes in one call "
                    "(--max-slice-bytes-per-call); ask for fewer rows per call"
                )
            blocks.append(block)
        return blocks

    async def _rows(self, request: RowRequest, lease: Lease | None) -> RowBlock:
        name = request.content_hash
        block = self.store.get(name, lease)
        if block is None and name in self._in_flight:
            try:
                block, _ = await asyncio.shield(self._in_flight[name])
            except InvalidItemError:
                block = None  # other bytes sent under this hash: the item is still unknown
            else:
                self.store.put(name, block, lease)
        if block is not None:
            _check_row_count(request, block.num_rows)
            if request.end > block.num_rows:
                raise ValueError(
                    f"rows [{request.start}, {request.end}) are outside item {name}, "
                    f"which has rows [0, {block.num_rows})"
                )
            return _served_rows(block, request.start, request.end)
        rows = await self.shared.get_rows(name, request.start, request.end) if self.shared else None
        if rows is None:
            self.counters.num_slice_misses += 1
            raise UnknownItemError(f"item {name} is not on this encoder; Encode it first")
        _check_row_count(request, self.shared.known_num_rows(name))
        self.counters.num_redis_hits += 1
        return rows

    def _batch_cost(self, item: EncodeItem) -> int:
        """An image's pixels from its header; a video the whole budget: it runs in a
        forward of its own (its frames' cost is known only once its container is read)."""
        if item.modality == Modality.VIDEO:
            return self.batcher.max_batch_cost or 1
        return self.decoder.pixels(item.modality, item.data)

    def release(self, owner: str, content_hashes: Sequence[str] | None) -> int:
        return self.store.release(owner, content_hashes)

    def expedite(self, decoder_id: str, sequence: int, content_hashes: Sequence[str]) -> int:
        """A decoder idles for these items, none: no longer (encoder_service.expedite).
        Returns how many of them are in flight here; the others are ignored."""
        in_flight = frozenset(h for h in content_hashes if h in self._in_flight)
        heard = self.expediter.hear(decoder_id, sequence, in_flight, self._in_flight)
        if heard and in_flight:
            self.counters.num_expedite_calls += 1
        return len(in_flight)

    def _batch_started(self, items: Sequence[EncodeItem]) -> None:
        self.expediter.batch_started([item.content_hash for item in items])

    def _batch_ended(self, items: Sequence[EncodeItem]) -> None:
        if self.expediter.batch_ended():
            self.counters.num_expedited_batches += 1

    def _run_batch(self, items: Sequence[EncodeItem]) -> list[RowBlock | Exception]:
        """On the compute thread, on the threads the batch is given."""
        return self.expediter.threads.run(self._encode_batch, items)

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
        try:
            self.family.check_options(item.options)
        except ValueError as error:
            raise InvalidItemError(f"item {item.content_hash}: {error}") from None

    def _encode_batch(self, items: Sequence[EncodeItem]) -> list[RowBlock | Exception]:
        """Runs on the model thread: decode, check the hashes of callers not trusted with
        them, one forward for the rest."""
        outcomes: list[RowBlock | Exception] = []
        decoded = []
        for index, item in enumerate(items):
            try:
                media = self._media(item)
            except ValueError as error:
                outcomes.append(InvalidItemError(str(error)))
                continue
            mismatch = self._check_hash(item, media)
            if mismatch is not None:
                outcomes.append(mismatch)
                continue
            outcomes.append(InvalidItemError("not encoded"))  # replaced below
            decoded.append((index, MediaInput(media, item.options)))
        # One forward per modality: a family's towers take one kind of input each.
        for modality in Modality:
            group = [(index, media) for index, media in decoded if media.modality == modality]
            if group:
                rows = self.family.encode([media for _, media in group])
                for (index, _), tensor in zip(group, rows, strict=True):
                    outcomes[index] = encode_rows(tensor)
        return outcomes

    def _media(
        self, item: EncodeItem
    ) -> DecodedImage | ProcessedImage | DecodedAudio | DecodedVideo:
        """What the tower takes: a trusted gateway's pixel values, else the decoded file."""
        if item.pixel_values is not None:
            self.counters.num_pixel_values_used += 1
            return ProcessedImage(item.pixel_values)
        return item.decoded or self.decoder.decode(item.modality, item.data, item.options)

    def _check_hash(
        self, item: EncodeItem, media: DecodedImage | ProcessedImage | DecodedAudio | DecodedVideo
    ) -> InvalidItemError | None:
        """The refusal of an item whose content does not have its hash; None when it has,
        or when its caller is trusted with hashes (then its pixels are not hashed at all)."""
        if item.hash_trusted:
            self.counters.num_hashes_trusted += 1
            return None
        self.counters.num_hashes_verified += 1
        actual = salted_hash(
            media.content_hash(self.family.fingerprint, item.options), item.cache_salt
        )
        if actual == item.content_hash:
            return None
        # The hash of what was sent is not said: it would be an oracle.
        return InvalidItemError(
            f"content hash {item.content_hash} does not match the item's content; "
            "do the gateway and encoder serve the same model?"
        )


def _served_rows(block: RowBlock, start: int, end: int) -> RowBlock:
    """Rows `[start, end)` of a cached item for a slice call: a view when they are at
    least half of the item, a copy when fewer. A call holds its rows until it has streamed
    them, so views keep evicted items alive no longer than that, and never more than
    twice the bytes the call asked for (--max-slice-bytes-per-call bounds those)."""
    if start == 0 and end == block.num_rows:
        return block
    if 2 * (end - start) >= block.num_rows:
        return block.view_rows(start, end)
    return block.rows(start, end)


def _check_row_count(request: RowRequest, num_rows: int | None) -> None:
    """A caller whose range has another length than the item names the wrong item (or
    the right one with a wrong layout): refused, never served a prefix of it."""
    if request.item_num_rows and num_rows is not None and num_rows != request.item_num_rows:
        raise ValueError(
            f"item {request.content_hash} has {num_rows} rows; the request's range says "
            f"{request.item_num_rows}"
        )
