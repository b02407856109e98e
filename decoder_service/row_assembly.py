"""One fetch's streamed row messages, assembled into one buffer as they arrive.

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

import torch

from tessera.tensor_codec import CodecError, check_block, itemsize, parse_dtype
from tessera.v1 import encoder_pb2


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

    @property
    def complete(self) -> bool:
        return self.next_row == self.row_end

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
            self._buffer = torch.empty(size, dtype=torch.uint8)
            self._view = memoryview(self._buffer.numpy())
        return self._view
