"""Fetching exactly the embedding rows a prefill chunk needs from the encoders.

For each item a chunk overlaps, the decoder asks encoders, preferred first, for rows
`[row_start, row_end)` only. An encoder that answers NOT_FOUND (the gateway's Encode has
not arrived yet, the item was evicted, or it is another replica) is sent the item's
bytes to encode, and asked again (`reencode.py`); an unreachable one is skipped for the
next.

The decoder dials only the encoders it discovered itself (`--encoders`): the addresses a
request names are hints that order them, never addresses to dial (`fetch_order`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import grpc
import torch

from decoder_service.reencode import Reencoder
from decoder_service.request import MediaSource
from decoder_service.row_assembly import BatchAssembler, RowAssembler, SliceStreamError
from tessera.channels import ChannelPoolFullError
from tessera.placeholders import ChunkSlice
from tessera.rendezvous import encoder_order
from tessera.replicas import ReplicaSet, UnknownReplicaError
from tessera.v1 import encoder_pb2, encoder_pb2_grpc

if TYPE_CHECKING:
    from decoder_service.colocated import ColocatedEncoder

log = logging.getLogger("tessera.decoder.fetch")

# The encoder's trouble, not the item's: another replica may serve it. Any other status
# (INVALID_ARGUMENT, NOT_FOUND with no bytes to re-encode from, ...) refuses the item.
_TRY_NEXT_REPLICA = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
}


class FetchError(RuntimeError):
    """No encoder could provide an item's rows: they are unreachable or failing. Not the
    decoder's fault, and not the request's."""


class ItemRefusedError(ValueError):
    """An encoder refused an item for what it is (bytes it cannot decode, a hash that
    does not match, rows outside the item): the request is at fault, retrying elsewhere
    cannot help."""


def fetch_order(content_hash: str, hints: Sequence[str], encoders: ReplicaSet) -> list[str]:
    """The encoders to ask for an item's rows, best first: the request's hints that are
    among the discovered encoders, in the request's order, then the decoder's own
    rendezvous order over the rest. An address not discovered is left out, so it is
    never dialed.

    Discovered a:1, b:1, c:1, own order for the item [c:1, a:1, b:1], hints
    [evil:1, b:1, b:1] -> [b:1, c:1, a:1].
    """
    discovered = set(encoders.addresses)
    order: list[str] = []
    for address in [*hints, *encoder_order(content_hash, encoders)]:
        if address in discovered and address not in order:
            order.append(address)
    return order


# A chunk's slices on one encoder go in one call of at most this many slices and about
# this many bytes (below the encoder's default --max-slices-per-call and
# --max-slice-bytes-per-call, so a batch is not refused for its size).
MAX_BATCH_SLICES = 256
MAX_BATCH_BYTES = 64 << 20


# How long an encoder that answered GetEmbeddingRows with UNIMPLEMENTED (an older
# version) is asked slice by slice instead, before it is tried again.
ROWS_UNIMPLEMENTED_SECONDS = 60.0
_GET_ROWS = "/tessera.v1.EncoderService/GetEmbeddingRows"


class _NotKeptError(RuntimeError):
    """An encoder lost an item between encoding it and serving its rows."""


# Whatever goes wrong with a batched call: its slices are then fetched one by one, where
# each failure is told apart (re-encode, next replica, refusal).
_BATCH_FAILURES = (
    grpc.aio.AioRpcError,
    SliceStreamError,
    UnknownReplicaError,
    ChannelPoolFullError,
)


def _row_slice(item: MediaSource, chunk_slice: ChunkSlice) -> encoder_pb2.RowSlice:
    """What to ask an encoder for one slice; the encoder refuses an item of another
    length than the whole item's (a range may hold only part of it)."""
    return encoder_pb2.RowSlice(
        content_hash=chunk_slice.content_hash,
        start=chunk_slice.row_start,
        end=chunk_slice.row_end,
        item_num_rows=item.range.num_item_rows,
    )


@dataclass(frozen=True)
class FetchedRows:
    slice: ChunkSlice
    rows: torch.Tensor  # [slice.num_rows, row_width] on CPU
    num_bytes: int
    reencoded: bool


class EmbeddingClient:
    def __init__(
        self,
        encoders: ReplicaSet,
        row_width: int,
        lease_ms: int,
        timeout_seconds: float,
        fetch_whole: bool = False,
        colocated: ColocatedEncoder | None = None,
        model_fingerprint: str = "",
    ):
        self.encoders = encoders
        # With --colocated-encoder: every item's rows come from this process's encoder.
        self.colocated = colocated
        # A benchmark baseline: fetch each overlapping item's whole embedding for every
        # chunk, and still place only the chunk's rows.
        self.fetch_whole = fetch_whole
        # Values per row: the model's hidden size times the item's planes.
        self.row_width = row_width
        self.lease_ms = lease_ms
        self.timeout_seconds = timeout_seconds
        self.num_bytes_received = 0
        # Items an encoder answered NOT_FOUND for, sent to it again (once per encoder).
        self.reencoder = Reencoder(encoders, lease_ms, timeout_seconds, model_fingerprint)
        # encoder address -> when it answered GetEmbeddingRows with UNIMPLEMENTED
        self._rows_unimplemented: dict[str, float] = {}

    def require_encoders(self) -> None:
        """Raises FetchError unless some encoder is known to fetch media rows from."""
        if self.encoders.addresses or self.colocated is not None:
            return
        if not self.encoders.targets:
            raise FetchError(
                "this decoder has no encoders to fetch media rows from: start it with "
                "--encoders host:port[,...] or --encoders dns:///name:port"
            )
        raise FetchError(
            f"no encoder discovered from --encoders {','.join(self.encoders.targets)} yet"
        )

    def order(self, item: MediaSource) -> list[str]:
        return fetch_order(item.range.content_hash, item.encoder_addresses, self.encoders)

    def computing_at(self, item: MediaSource) -> str | None:
        """The encoder that computes `item` for this decoder: where it sent the item
        again (its first choice lost it) or where a fetch moved on to (the ones before
        failed), else its first choice; None without encoders."""
        order = self.order(item)
        elsewhere = self.reencoder.computing_at(order, item.range.content_hash)
        return elsewhere or (order[0] if order else None)

    async def fetch_chunk(
        self, request_id: str, items: Sequence[MediaSource], slices: Sequence[ChunkSlice]
    ) -> list[FetchedRows]:
        """The rows of every slice of one chunk: one GetEmbeddingRows call per encoder
        for all the slices it is first choice for (per-call and per-message costs
        dominate), concurrently. A batch that fails in any way is fetched again slice by
        slice, with the whole recovery path (re-encode, next replica, refusal) per item."""
        if self.colocated is not None or self.fetch_whole:
            return await self._fetch_each(request_id, items, range(len(slices)), slices)
        self.require_encoders()
        results: list[FetchedRows | None] = [None] * len(slices)

        async def fetch_batch(address: str, indices: list[int]) -> None:
            if self._has_rows_rpc(address):
                fetched = await self._fetch_batch(address, request_id, items, slices, indices)
            else:
                fetched = await self._fetch_each(request_id, items, indices, slices)
            for index, rows in zip(indices, fetched, strict=True):
                results[index] = rows

        await asyncio.gather(*(fetch_batch(a, b) for a, b in self._batches(items, slices)))
        if any(rows is None for rows in results):
            raise AssertionError("a batch left a slice unfetched")
        return list(results)

    async def _fetch_batch(
        self,
        address: str,
        request_id: str,
        items: Sequence[MediaSource],
        slices: Sequence[ChunkSlice],
        indices: list[int],
    ) -> list[FetchedRows]:
        try:
            return await self._stream_batch(address, request_id, items, slices, indices)
        except _BATCH_FAILURES as error:
            if (
                isinstance(error, grpc.aio.AioRpcError)
                and error.code() == grpc.StatusCode.UNIMPLEMENTED
            ):
                self._rows_unimplemented[address] = time.monotonic()
            log.info("batched fetch from %s failed (%s); fetching slice by slice", address, error)
        return await self._fetch_each(request_id, items, indices, slices)

    async def _fetch_each(
        self,
        request_id: str,
        items: Sequence[MediaSource],
        indices: Sequence[int],
        slices: Sequence[ChunkSlice],
    ) -> list[FetchedRows]:
        return list(
            await asyncio.gather(
                *(
                    self.fetch_slice(request_id, items[slices[i].item_index], slices[i])
                    for i in indices
                )
            )
        )

    def _has_rows_rpc(self, address: str) -> bool:
        """False for a while after `address` answered GetEmbeddingRows with UNIMPLEMENTED."""
        since = self._rows_unimplemented.get(address)
        if since is None:
            return True
        if time.monotonic() - since < ROWS_UNIMPLEMENTED_SECONDS:
            return False
        del self._rows_unimplemented[address]
        return True

    def _batches(
        self, items: Sequence[MediaSource], slices: Sequence[ChunkSlice]
    ) -> list[tuple[str, list[int]]]:
        """Slice indices by first-choice encoder, in batches of at most
        MAX_BATCH_SLICES slices and about MAX_BATCH_BYTES (at 4 bytes a value)."""
        batches: list[tuple[str, list[int]]] = []
        open_batches: dict[str, tuple[list[int], int]] = {}
        for index, chunk_slice in enumerate(slices):
            order = self.order(items[chunk_slice.item_index])
            address = order[0] if order else ""
            num_bytes = chunk_slice.num_rows * self.row_width * 4
            indices, size = open_batches.get(address, ([], 0))
            if indices and (len(indices) >= MAX_BATCH_SLICES or size + num_bytes > MAX_BATCH_BYTES):
                indices, size = [], 0
            if not indices:
                batches.append((address, indices))
            indices.append(index)
            open_batches[address] = (indices, size + num_bytes)
        return batches

    async def fetch_slice(
        self, request_id: str, item: MediaSource, chunk_slice: ChunkSlice
    ) -> FetchedRows:
        if not self.fetch_whole:
            return await self._fetch_any(request_id, item, chunk_slice)
        whole = replace(chunk_slice, row_start=0, row_end=item.range.num_item_rows)
        fetched = await self._fetch_any(request_id, item, whole)
        rows = fetched.rows[chunk_slice.row_start : chunk_slice.row_end]
        return FetchedRows(chunk_slice, rows, fetched.num_bytes, fetched.reencoded)

    async def _fetch_any(
        self, request_id: str, item: MediaSource, chunk_slice: ChunkSlice
    ) -> FetchedRows:
        if self.colocated is not None:
            local = await self.colocated.rows(request_id, item, chunk_slice)
            self.num_bytes_received += local.num_bytes
            return FetchedRows(chunk_slice, local.rows, local.num_bytes, local.encoded)
        self.require_encoders()
        errors = []
        for position, address in enumerate(self.order(item)):
            try:
                with self.reencoder.fetching(address, item.range.content_hash, position > 0):
                    return await self._fetch_from(address, request_id, item, chunk_slice)
            except UnknownReplicaError:  # it left the set while earlier ones were tried
                continue
            except ChannelPoolFullError as error:
                log.error("%s", error)
                errors.append(f"{address}: {error}")
            except _NotKeptError as error:
                log.warning("%s; trying the next encoder", error)
                errors.append(str(error))
            except SliceStreamError as error:
                log.warning("encoder %s: %s; trying the next", address, error)
                errors.append(f"{address}: {error}")
            except grpc.aio.AioRpcError as error:
                if error.code() not in _TRY_NEXT_REPLICA:
                    raise ItemRefusedError(
                        f"encoder {address} refused item {chunk_slice.content_hash}: "
                        f"{error.details()}"
                    ) from None
                log.warning("encoder %s failed (%s); trying the next", address, error.code().name)
                errors.append(f"{address}: {error.code().name}")
        tried = "; ".join(errors) or "every encoder left while trying"
        raise FetchError(f"no encoder could provide item {chunk_slice.content_hash} ({tried})")

    async def _fetch_from(
        self, address: str, request_id: str, item: MediaSource, chunk_slice: ChunkSlice
    ) -> FetchedRows:
        stub = encoder_pb2_grpc.EncoderServiceStub(self.encoders.channel(address))
        try:
            return await self._stream_rows(stub, request_id, item, chunk_slice, reencoded=False)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND or not item.data:
                raise
        sent = await self.reencoder.encode_once(address, request_id, item)
        try:
            return await self._stream_rows(stub, request_id, item, chunk_slice, reencoded=sent)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            # Encoded, then gone before it could be read: the encoder could not keep it
            # (its cache is full and its pin budget spent). Its trouble, not the item's.
            raise _NotKeptError(f"{address}: evicted right after encoding") from None

    async def _stream_batch(
        self,
        address: str,
        request_id: str,
        items: Sequence[MediaSource],
        slices: Sequence[ChunkSlice],
        indices: Sequence[int],
    ) -> list[FetchedRows]:
        """Every slice of `indices` from `address` in one GetEmbeddingRows call: the
        encoder streams their rows in request order, back to back, into one buffer."""
        if not address:
            raise UnknownReplicaError("no encoder to ask")
        wanted = [slices[i] for i in indices]
        request = encoder_pb2.GetEmbeddingSlicesRequest(
            slices=[_row_slice(items[s.item_index], s) for s in wanted],
            lease_owner=request_id,
            lease_ms=self.lease_ms,
        )
        rows = BatchAssembler(
            [(s.content_hash, s.row_start, s.row_end) for s in wanted], self.row_width
        )
        # No response deserializer: the messages arrive as bytes, and only their rows are
        # copied, once, into the buffer (tessera.row_stream).
        get_rows = self.encoders.channel(address).unary_stream(
            _GET_ROWS,
            request_serializer=encoder_pb2.GetEmbeddingSlicesRequest.SerializeToString,
            _registered_method=True,
        )
        call = get_rows(request, timeout=self.timeout_seconds)
        try:
            async for message in call:
                self.num_bytes_received += rows.add(message)
            parts = rows.finish()
        except SliceStreamError:
            call.cancel()  # or the encoder streams on into the window, for nothing
            raise
        row_bytes = rows.num_bytes // rows.total_rows
        return [
            FetchedRows(s, part, part.shape[0] * row_bytes, False)
            for s, part in zip(wanted, parts, strict=True)
        ]

    async def _stream_rows(
        self,
        stub: encoder_pb2_grpc.EncoderServiceStub,
        request_id: str,
        item: MediaSource,
        chunk_slice: ChunkSlice,
        reencoded: bool,
    ) -> FetchedRows:
        request = encoder_pb2.GetEmbeddingSlicesRequest(
            slices=[_row_slice(item, chunk_slice)],
            lease_owner=request_id,
            lease_ms=self.lease_ms,
        )
        rows = RowAssembler(
            chunk_slice.content_hash, chunk_slice.row_start, chunk_slice.row_end, self.row_width
        )
        call = stub.GetEmbeddingSlices(request, timeout=self.timeout_seconds)
        try:
            async for message in call:
                # Counted as received even if a later message spoils the stream: they were.
                self.num_bytes_received += rows.add(message)
            return FetchedRows(chunk_slice, rows.finish(), rows.num_bytes, reencoded)
        except SliceStreamError:
            call.cancel()  # or the encoder streams on into the window, for nothing
            raise
