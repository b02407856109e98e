"""gRPC face of the encoder: proto <-> domain objects, exceptions -> status codes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from encoder_service.encoder import EncoderCore
from encoder_service.hash_trust import HashTrust
from encoder_service.items import (
    EncodeItem,
    InvalidItemError,
    RowRequest,
    Source,
    UnknownItemError,
)
from encoder_service.memory_store import Lease
from encoder_service.processed_pixels import FilesWantedError, pixels_of
from encoder_service.stats import stats_to_proto
from tessera.access import caller_name
from tessera.limits import MAX_EXPEDITE_HASHES, check_cache_salt, check_request_id
from tessera.media import ProcessingOptions
from tessera.row_stream import encode_rows_message
from tessera.server import abort_unless_ready
from tessera.tensor_codec import RowBlock
from tessera.v1 import encoder_pb2, encoder_pb2_grpc
from tessera.wire import FILES_WANTED_KEY, fill_block_proto, modality_from_proto

SERVICE = "tessera.v1.EncoderService"
_SOURCE_TO_PROTO = {
    Source.COMPUTED: encoder_pb2.ENCODE_SOURCE_COMPUTED,
    Source.MEMORY: encoder_pb2.ENCODE_SOURCE_MEMORY,
    Source.JOINED: encoder_pb2.ENCODE_SOURCE_JOINED,
    Source.REDIS: encoder_pb2.ENCODE_SOURCE_REDIS,
}


@dataclass(frozen=True)
class CallLimits:
    """What one call may ask of this encoder, whoever makes it."""

    default_lease_ms: int
    max_lease_ms: int
    max_slices_per_call: int
    max_slice_bytes_per_call: int


class EncoderServicer(encoder_pb2_grpc.EncoderServiceServicer):
    def __init__(self, limits: CallLimits, slice_message_bytes: int, trust: HashTrust):
        self.core: EncoderCore | None = None  # set once the model is loaded
        self.background: list[asyncio.Task] = []
        self.limits = limits
        self.slice_message_bytes = slice_message_bytes
        self.trust = trust

    def _lease(self, owner: str, lease_ms: int) -> Lease | None:
        """Raises ValueError for a lease longer than --max-lease-ms or an overlong owner."""
        check_request_id(owner, "lease_owner")
        if lease_ms > self.limits.max_lease_ms:
            raise ValueError(
                f"lease_ms {lease_ms} is above this encoder's limit of "
                f"{self.limits.max_lease_ms} (--max-lease-ms)"
            )
        return Lease(owner, (lease_ms or self.limits.default_lease_ms) / 1000) if owner else None

    async def Encode(self, request, context):
        await abort_unless_ready(context, self.core is not None)
        try:
            family = self.core.family
            trusted = self.trust.trusts(
                caller_name(context), request.model_fingerprint, family.fingerprint
            )
            items = [
                EncodeItem(
                    item.content_hash,
                    modality_from_proto(item.modality),
                    item.data,
                    ProcessingOptions.of(item.processing_options),
                    check_cache_salt(item.cache_salt),
                    hash_trusted=trusted,
                    pixel_values=pixels_of(
                        item, trusted, family.processed_pixels_shape, self.core.counters
                    ),
                )
                for item in request.items
            ]
            pending = self.core.begin_encode(
                items, self._lease(request.lease_owner, request.lease_ms)
            )
            # Every item is now in memory or in flight here: the early initial metadata
            # tells the caller so (a gateway sends its decode request only then, so the
            # decoder's first fetch finds the items instead of racing this call and
            # sending their bytes a second time).
            await _announce(context, pending)
            results = await pending
        except FilesWantedError as error:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, str(error), ((FILES_WANTED_KEY, "1"),)
            )
        except (InvalidItemError, ValueError) as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return encoder_pb2.EncodeResponse(
            items=[
                encoder_pb2.EncodedItem(
                    content_hash=result.content_hash,
                    num_rows=result.block.num_rows,
                    hidden_size=result.block.hidden_size,
                    dtype=result.block.dtype,
                    source=_SOURCE_TO_PROTO[result.source],
                )
                for result in results
            ]
        )

    async def _resolve(self, request, context) -> tuple[list[RowRequest], list[RowBlock]]:
        """The rows a slice call asks for, within this encoder's per-call bounds; aborts
        the call with NOT_FOUND or INVALID_ARGUMENT otherwise."""
        await abort_unless_ready(context, self.core is not None)
        self.core.counters.num_slice_calls += 1
        requests = [
            RowRequest(s.content_hash, s.start, s.end, s.item_num_rows) for s in request.slices
        ]
        try:
            if len(requests) > self.limits.max_slices_per_call:
                raise ValueError(
                    f"{len(requests)} slices in one call; at most "
                    f"{self.limits.max_slices_per_call} (--max-slices-per-call)"
                )
            blocks = await self.core.resolve_slices(
                requests,
                self._lease(request.lease_owner, request.lease_ms),
                self.limits.max_slice_bytes_per_call,
            )
        except UnknownItemError as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        return requests, blocks

    async def GetEmbeddingSlices(
        self, request, context
    ) -> AsyncIterator[encoder_pb2.EmbeddingSlice]:
        requests, blocks = await self._resolve(request, context)
        for row_request, block in zip(requests, blocks, strict=True):
            rows_per_message = max(1, self.slice_message_bytes // block.row_bytes)
            for first in range(0, block.num_rows, rows_per_message):
                part = block.rows(first, min(first + rows_per_message, block.num_rows))
                self.core.counters.num_bytes_served += len(part.data)
                message = encoder_pb2.EmbeddingSlice(
                    content_hash=row_request.content_hash, start=row_request.start + first
                )
                fill_block_proto(message.rows, part)  # in place: no second copy of the rows
                yield message

    async def GetEmbeddingRows(self, request, context) -> AsyncIterator[bytes]:
        """Yields serialized EmbeddingRows messages (registered with a pass-through
        serializer, `add_to_server`): each joins its rows straight from the blocks."""
        _, blocks = await self._resolve(request, context)
        if not blocks:
            return
        dtype, width = blocks[0].dtype, blocks[0].hidden_size
        if any(b.dtype != dtype or b.hidden_size != width for b in blocks):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the slices' rows differ in dtype or width; ask for them in separate calls",
            )
        row_bytes = blocks[0].row_bytes
        rows_per_message = max(1, self.slice_message_bytes // row_bytes)
        views = [memoryview(block.data) for block in blocks]
        first_row = 0  # of the message being filled, among all the rows asked for
        parts: list[memoryview] = []
        num_rows = 0
        for view in views:
            at = 0
            while at < len(view):
                take = min(len(view) - at, (rows_per_message - num_rows) * row_bytes)
                parts.append(view[at : at + take])
                at += take
                num_rows += take // row_bytes
                if num_rows == rows_per_message:
                    yield self._rows_message(first_row, dtype, width, parts)
                    first_row, parts, num_rows = first_row + num_rows, [], 0
        if parts:
            yield self._rows_message(first_row, dtype, width, parts)

    def _rows_message(self, first_row: int, dtype: str, width: int, parts) -> bytes:
        message = encode_rows_message(first_row, dtype, width, parts)
        self.core.counters.num_bytes_served += sum(len(part) for part in parts)
        return message

    async def ReleaseLeases(self, request, context):
        await abort_unless_ready(context, self.core is not None)
        released = self.core.release(request.lease_owner, list(request.content_hashes) or None)
        return encoder_pb2.ReleaseLeasesResponse(num_released=released)

    async def Expedite(self, request, context):
        await abort_unless_ready(context, self.core is not None)
        if len(request.content_hashes) > MAX_EXPEDITE_HASHES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Expedite names {len(request.content_hashes)} items; at most "
                f"{MAX_EXPEDITE_HASHES} in one call",
            )
        try:
            check_request_id(request.decoder_id, "decoder_id")
        except ValueError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        num_in_flight = self.core.expedite(
            request.decoder_id, request.sequence, list(request.content_hashes)
        )
        return encoder_pb2.ExpediteResponse(num_in_flight=num_in_flight)

    async def GetStats(self, request, context):
        await abort_unless_ready(context, self.core is not None)
        return stats_to_proto(self.core)


async def _announce(context, pending: asyncio.Future) -> None:
    """Sends the call's initial metadata now; should the caller be gone, the work goes on
    for the others who share it and its outcome is not left unretrieved."""
    try:
        await context.send_initial_metadata(())
    except BaseException:
        pending.add_done_callback(lambda done: done.cancelled() or done.exception())
        raise


def _pass_through(message: bytes) -> bytes:
    return message


class _Handlers:
    """Collects the method handlers the generated code registers."""

    def __init__(self):
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the same handlers as below

    def add_registered_method_handlers(self, service: str, handlers) -> None:
        self.handlers.update(handlers)


def add_to_server(servicer: EncoderServicer, server: grpc.aio.Server) -> None:
    """The generated registration, except that GetEmbeddingRows sends the bytes its
    handler yields as they are (it serializes its messages itself: tessera.row_stream)."""
    collected = _Handlers()
    encoder_pb2_grpc.add_EncoderServiceServicer_to_server(servicer, collected)
    handlers = dict(collected.handlers)
    rows = handlers["GetEmbeddingRows"]
    handlers["GetEmbeddingRows"] = grpc.unary_stream_rpc_method_handler(
        rows.unary_stream,
        request_deserializer=rows.request_deserializer,
        response_serializer=_pass_through,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
