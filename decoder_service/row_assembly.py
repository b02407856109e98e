"""One fetch's streamed row messages, assembled into one buffer as they arrive.

`BatchAssembler` takes a GetEmbeddingRows stream (every slice of a chunk on one encoder,
the decoder's fetch); `RowAssembler` a GetEmbeddingSlices stream of one slice (the
slice-by-slice recovery path, and encoders that do not have GetEmbeddingRows).

A fetch asks an encoder for rows `[row_start, row_end)` of one item and gets them back in
messages of about 1 MiB. Each message's bytes are copied once (a plain memcpy through a
memoryview), by offset, into one uninitialised byte tensor of exactly the bytes asked
for, which is viewed as rows once at the end: no per-message tensor, no torch copy and
no concatenation on the event loop. (A torch copy
fans out to torch's intra-op threads, which on a small machine compete with the model's
forward: it made the decoder's client 3x slower than a bare gRPC reader.)

Everything about a message is checked before its bytes are kept; a stream that is short,
overlong, out of order or of another dtype or width is the sending encoder's fault.
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import threading

import torch

from tessera.row_stream import RowStreamError, decode_rows_message
from tessera.tensor_codec import CodecError, check_block, itemsize, parse_dtype
from tessera.v1 import encoder_pb2

# Buffers from this size on are mapped with transparent huge pages where the kernel
# offers them (`madvise` mode), and used again once nothing holds their rows: touching
# fresh pages costs more than the copy into them (filling a 32 MiB buffer here: ~13 ms
# in fresh 4 KiB pages, ~2 ms in fresh 2 MiB ones, ~1.2 ms reused). Below it torch.empty,
# whose small blocks malloc reuses.
HUGE_PAGE_BYTES = 2 << 20
# Most bytes of large buffers kept for use again, busy or idle; past it a buffer is
# unmapped when its rows are freed.
MAX_RECYCLED_BYTES = 64 << 20


class RecycledBuffers:
    """Large anonymous mappings handed out as uint8 tensors, each handed out again only
    once every tensor on it is gone. A tensor made by torch.frombuffer holds a reference
    to its mapping until its storage (every view of it) is freed, so a mapping that only
    this pool references holds nobody's rows."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._mappings: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.num_reused = 0

    def take(self, num_bytes: int) -> torch.Tensor:
        """`num_bytes` uninitialised bytes on a free mapping of at most twice that size,
        or on a new one."""
        with self._lock:
            memory = self._free(num_bytes)
            if memory is None:
                memory = _huge_mapping(-(-num_bytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES)
                self._keep(memory)
            else:
                self.num_reused += 1
            return torch.frombuffer(memory, dtype=torch.uint8, count=num_bytes)

    @property
    def num_bytes(self) -> int:
        return sum(len(memory) for memory in self._mappings)

    def _free(self, num_bytes: int) -> mmap.mmap | None:
        best = None
        for memory in self._mappings:
            # References: the list, `memory` and getrefcount's argument; a tensor adds one.
            fits = num_bytes <= len(memory) <= 2 * num_bytes
            if fits and sys.getrefcount(memory) == 3 and (best is None or len(memory) < len(best)):
                best = memory
        return best

    def _keep(self, new: mmap.mmap) -> None:
        """Keeps `new` for use again, dropping idle mappings (largest first) to stay within
        max_bytes; if the busy ones leave no room, `new` is not kept."""
        idle = sorted((m for m in self._mappings if sys.getrefcount(m) == 3), key=len, reverse=True)
        while idle and self.num_bytes + len(new) > self.max_bytes:
            self._mappings.remove(idle.pop(0))
        if self.num_bytes + len(new) <= self.max_bytes:
            self._mappings.append(new)


def _huge_mapping(num_bytes: int) -> mmap.mmap:
    # Private: a shared anonymous mapping is shmem, where huge pages are another setting.
    memory = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # no transparent huge pages: 4 KiB ones, as before
        memory.madvise(mmap.MADV_HUGEPAGE)
    return memory


_LARGE_BUFFERS = RecycledBuffers(MAX_RECYCLED_BYTES)


def empty_bytes(num_bytes: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of `num_bytes`; a large one on a recycled mapping."""
    if num_bytes < HUGE_PAGE_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(num_bytes, dtype=torch.uint8)
    return _LARGE_BUFFERS.take(num_bytes)


class SliceStreamError(RuntimeError):
    """An encoder's stream does not carry exactly the rows asked for. Its fault, not the
    item's: another replica may send them right."""


class RowAssembler:
    """Rows `[row_start, row_end)` of item `content_hash`, `row_width` values each."""

    def __init__(self, content_hash: str, row_start: int, row_end: int, row_width: int):
        if not 0 <= row_start < row_end or row_width < 1:
            raise ValueError(f"rows [{row_start}, {row_end}) x {row_width} are empty")
        self.content_hash = content_hash
        self.row_start, self.row_end, self.row_width = row_start, row_end, row_width
        self.next_row = row_start
        self.num_bytes = 0
        # Set by the first message: the encoder's dtype decides the buffer's size.
        self.dtype: str | None = None
        self._buffer: torch.Tensor | None = None  # uint8, not zeroed: every byte is written
        self._view: memoryview | None = None

    def add(self, message: encoder_pb2.EmbeddingSlice) -> int:
        """Checks one message and copies its rows into place; returns its byte count."""
        rows = message.rows
        # Read once: each read of a bytes field copies it out of the message.
        data = rows.data
        shape = list(rows.shape)
        try:
            check_block(rows.dtype, shape, len(data))
        except CodecError as error:
            raise SliceStreamError(f"malformed embedding slice: {error}") from None
        self._check_place(message, rows.dtype, shape)
        view = self._view_for(rows.dtype)
        offset = self.num_bytes
        view[offset : offset + len(data)] = data
        self.next_row += shape[0]
        self.num_bytes += len(data)
        return len(data)

    def finish(self) -> torch.Tensor:
        """The `[row_end - row_start, row_width]` rows; raises SliceStreamError unless
        every row arrived."""
        if self._buffer is None or self.next_row != self.row_end:
            raise SliceStreamError(
                f"encoder sent rows [{self.row_start}, {self.next_row}) of item "
                f"{self.content_hash}, expected up to {self.row_end}"
            )
        self._view.release()
        rows = self._buffer.view(parse_dtype(self.dtype))
        return rows.view(self.row_end - self.row_start, self.row_width)

    def _check_place(self, message: encoder_pb2.EmbeddingSlice, dtype: str, shape: list[int]):
        if message.content_hash != self.content_hash or message.start != self.next_row:
            raise SliceStreamError(
                f"encoder sent rows of {message.content_hash} from {message.start}, "
                f"expected {self.content_hash} from {self.next_row}"
            )
        num_rows, width = shape
        if width != self.row_width or self.next_row + num_rows > self.row_end:
            raise SliceStreamError(
                f"encoder sent a [{num_rows}, {width}] block at row {self.next_row}; "
                f"expected rows {self.row_width} wide and below row {self.row_end}"
            )
        if self.dtype is not None and dtype != self.dtype:
            raise SliceStreamError(
                f"encoder sent {dtype} rows at row {self.next_row} after {self.dtype} ones"
            )

    def _view_for(self, dtype: str) -> memoryview:
        if self._view is None:
            size = (self.row_end - self.row_start) * self.row_width * itemsize(dtype)
            self.dtype = dtype
            self._buffer = empty_bytes(size)
            self._view = memoryview(self._buffer.numpy())
        return self._view


class BatchAssembler:
    """The rows of several slices asked for in one GetEmbeddingRows call, in one buffer.

    The encoder streams the slices' rows in request order, back to back, in messages that
    may each span several slices (`tessera.row_stream`); each message's rows are copied
    once, from the received bytes to their offset in one uninitialised buffer of exactly
    the rows asked for, and each slice's rows are a view of it.
    """

    def __init__(self, slices: list[tuple[str, int, int]], row_width: int):
        """`slices`: (content_hash, row_start, row_end) of each slice, in request order."""
        if not slices or row_width < 1:
            raise ValueError("a batch needs slices and a row width")
        for content_hash, row_start, row_end in slices:
            if not 0 <= row_start < row_end:
                raise ValueError(f"rows [{row_start}, {row_end}) of {content_hash} are empty")
        self.slices = slices
        self.row_width = row_width
        self.total_rows = sum(end - start for _, start, end in slices)
        self.next_row = 0  # among all the rows asked for
        self.num_bytes = 0
        self.dtype: str | None = None  # set by the first message
        self._row_bytes = 0
        self._buffer: torch.Tensor | None = None  # uint8, not zeroed: every byte is written
        self._view: memoryview | None = None

    def add(self, raw: bytes) -> int:
        """Checks one serialized EmbeddingRows message and copies its rows into place;
        returns its row bytes."""
        try:
            head, data = decode_rows_message(raw)
        except RowStreamError as error:
            raise SliceStreamError(f"malformed embedding rows: {error}") from None
        self._check(head, len(data))
        offset = self.num_bytes
        self._view_for(head.dtype)[offset : offset + len(data)] = data
        self.next_row += len(data) // self._row_bytes
        self.num_bytes += len(data)
        return len(data)

    def finish(self) -> list[torch.Tensor]:
        """Each slice's `[row_end - row_start, row_width]` rows, views of one buffer;
        raises SliceStreamError unless every row arrived."""
        if self._buffer is None or self.next_row != self.total_rows:
            raise SliceStreamError(
                f"encoder sent {self.next_row} of the {self.total_rows} rows asked for"
            )
        self._view.release()
        rows = self._buffer.view(parse_dtype(self.dtype)).view(self.total_rows, self.row_width)
        out, at = [], 0
        for _, row_start, row_end in self.slices:
            out.append(rows[at : at + row_end - row_start])
            at += row_end - row_start
        return out

    def _check(self, head: encoder_pb2.EmbeddingRows, num_bytes: int) -> None:
        if self.dtype is not None and head.dtype != self.dtype:
            raise SliceStreamError(
                f"encoder sent {head.dtype} rows at row {self.next_row} after {self.dtype} ones"
            )
        try:
            size = itemsize(head.dtype)
        except CodecError as error:
            raise SliceStreamError(f"malformed embedding rows: {error}") from None
        row_bytes = head.row_width * size
        if head.row_width != self.row_width or num_bytes == 0 or num_bytes % row_bytes:
            raise SliceStreamError(
                f"encoder sent {num_bytes} bytes of rows {head.row_width} wide; expected "
                f"whole rows {self.row_width} wide"
            )
        num_rows = num_bytes // row_bytes
        if head.first_row != self.next_row or self.next_row + num_rows > self.total_rows:
            raise SliceStreamError(
                f"encoder sent rows [{head.first_row}, {head.first_row + num_rows}) of the "
                f"call; expected from row {self.next_row} and below row {self.total_rows}"
            )

    def _view_for(self, dtype: str) -> memoryview:
        if self._view is None:
            self.dtype = dtype
            self._row_bytes = self.row_width * itemsize(dtype)
            self._buffer = empty_bytes(self.total_rows * self._row_bytes)
            self._view = memoryview(self._buffer.numpy())
        return self._view
