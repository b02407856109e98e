"""Embedding rows <-> (dtype, shape, raw little-endian bytes), with strict checks.

Nothing on the wire or in a store is ever unpickled: a block is its dtype name, its
shape and exactly prod(shape) * itemsize bytes, or it is rejected.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("tessera's tensor codec assumes a little-endian host")


class CodecError(ValueError):
    """A block whose dtype, shape or byte count is not consistent."""


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise CodecError(f"unsupported dtype {dtype}; use one of {sorted(DTYPES)}")


def itemsize(name: str) -> int:
    # Read off the dtype, not an allocated tensor: it is asked once per streamed message.
    return parse_dtype(name).itemsize


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise CodecError(f"unsupported dtype {name!r}; use one of {sorted(DTYPES)}") from None


@dataclass(frozen=True)
class RowBlock:
    """A 2-D block of rows as bytes: `data` holds `num_rows * hidden_size` elements. It is
    a memoryview where it is rows served out of a larger buffer without copying them
    (`view_rows`); `bytes(block.data)` is the bytes either way."""

    dtype: str
    num_rows: int
    hidden_size: int
    data: bytes | memoryview

    @property
    def row_bytes(self) -> int:
        return self.hidden_size * itemsize(self.dtype)

    def rows(self, start: int, end: int) -> RowBlock:
        """Rows `[start, end)` of this block."""
        if not 0 <= start < end <= self.num_rows:
            raise CodecError(f"rows [{start}, {end}) outside [0, {self.num_rows})")
        row_bytes = self.row_bytes
        return RowBlock(
            self.dtype,
            end - start,
            self.hidden_size,
            self.data[start * row_bytes : end * row_bytes],
        )

    def view_rows(self, start: int, end: int) -> RowBlock:
        """Rows `[start, end)` as a view of this block's bytes: nothing copied, and this
        block's bytes stay alive as long as the view does."""
        if not 0 <= start < end <= self.num_rows:
            raise CodecError(f"rows [{start}, {end}) outside [0, {self.num_rows})")
        row_bytes = self.row_bytes
        data = memoryview(self.data)[start * row_bytes : end * row_bytes]
        return RowBlock(self.dtype, end - start, self.hidden_size, data)


def encode_rows(tensor: torch.Tensor) -> RowBlock:
    """A 2-D tensor (any device) as a RowBlock."""
    if tensor.dim() != 2 or tensor.numel() == 0:
        raise CodecError(
            f"expected a 2-D [rows >= 1, hidden >= 1] tensor, got shape {list(tensor.shape)}"
        )
    name = dtype_name(tensor.dtype)
    return RowBlock(name, tensor.shape[0], tensor.shape[1], _raw_bytes(tensor))


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's elements (any device) as row-major little-endian bytes."""
    return tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()


def check_block(dtype: str, shape: list[int] | tuple[int, ...], num_bytes: int) -> None:
    """Raises CodecError unless `num_bytes` is exactly what `dtype` and `shape` imply."""
    size = itemsize(dtype)
    if len(shape) != 2 or min(shape, default=0) < 1:
        raise CodecError(f"expected shape [rows >= 1, hidden >= 1], got {list(shape)}")
    expected = math.prod(shape) * size
    if num_bytes != expected:
        raise CodecError(
            f"{num_bytes} bytes do not fit dtype {dtype} and shape {list(shape)} "
            f"(expected {expected})"
        )


def decode_rows(dtype: str, shape: list[int] | tuple[int, ...], data: bytes) -> torch.Tensor:
    """Bytes back to a `[rows, hidden]` CPU tensor, after checking they fit exactly."""
    check_block(dtype, shape, len(data))
    flat = torch.frombuffer(bytearray(data), dtype=parse_dtype(dtype))
    return flat.view(shape[0], shape[1])


# Image processors return float32 pixel values; the tower casts them to its own dtype.
PIXELS_DTYPE = "float32"


def encode_pixels(tensor: torch.Tensor) -> bytes:
    """One image's float32 pixel values (any shape, any device) as raw bytes."""
    if tensor.dtype != torch.float32:
        raise CodecError(f"pixel values are {PIXELS_DTYPE}, got {tensor.dtype}")
    return _raw_bytes(tensor)


def decode_pixels(
    dtype: str, shape: list[int] | tuple[int, ...], data: bytes, expected_shape: tuple[int, ...]
) -> torch.Tensor:
    """Raw bytes back to one image's pixel values, which must be float32 of exactly
    `expected_shape` (what this model's image processor makes)."""
    if dtype != PIXELS_DTYPE:
        raise CodecError(f"pixel values must be {PIXELS_DTYPE}, got {dtype!r}")
    if tuple(shape) != tuple(expected_shape):
        raise CodecError(
            f"pixel values of shape {list(shape)}; this model's image processor makes "
            f"{list(expected_shape)}"
        )
    expected = math.prod(expected_shape) * torch.float32.itemsize
    if len(data) != expected:
        raise CodecError(f"{len(data)} bytes of pixel values; shape {list(shape)} needs {expected}")
    return torch.frombuffer(bytearray(data), dtype=torch.float32).view(expected_shape)
