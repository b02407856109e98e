"""The bytes of one `EmbeddingRows` message, written and read without copying its rows.

Python gRPC hands a stream's messages over as `bytes` and wants `bytes` back, and a
protobuf `bytes` field is copied on every set and every read. For the rows of a
GetEmbeddingRows stream (most of what the encoder sends) both sides skip protobuf for
that one field: the encoder serializes the small fields with protobuf and appends the
`data` field itself, joining the rows straight from its store into the message (one
copy); the decoder finds `data` in the received bytes and copies it from there once,
into the fetch's buffer. The result is ordinary protobuf: any reader of EmbeddingRows
parses it.

Reading is strict: a message is a sequence of well-formed fields with exactly one
`data`, or it is refused (`RowStreamError`); the other fields are parsed by protobuf.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import DecodeError

from tessera.v1 import encoder_pb2

_DATA_FIELD = encoder_pb2.EmbeddingRows.DESCRIPTOR.fields_by_name["data"].number
_LENGTH_DELIMITED = 2
_DATA_TAG = bytes([(_DATA_FIELD << 3) | _LENGTH_DELIMITED])  # one byte: field < 16
# Wire types whose value is a fixed number of bytes.
_FIXED_SIZE = {1: 8, 5: 4}
_MAX_VARINT_BYTES = 10


class RowStreamError(ValueError):
    """Bytes that are not one well-formed EmbeddingRows message with its rows."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_rows_message(
    first_row: int, dtype: str, row_width: int, parts: Sequence[bytes | memoryview]
) -> bytes:
    """An EmbeddingRows message whose `data` is `parts` back to back, copied once."""
    head = encoder_pb2.EmbeddingRows(
        first_row=first_row, dtype=dtype, row_width=row_width
    ).SerializeToString()
    size = sum(len(part) for part in parts)
    return b"".join((head, _DATA_TAG, _varint(size), *parts))


def _read_varint(raw: memoryview, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    for i in range(at, min(at + _MAX_VARINT_BYTES, len(raw))):
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise RowStreamError("truncated or overlong varint")


def decode_rows_message(raw: bytes) -> tuple[encoder_pb2.EmbeddingRows, memoryview]:
    """The message's fields other than `data` (parsed by protobuf), and a view of `data`
    inside `raw`. Raises RowStreamError for anything but well-formed fields with exactly
    one `data`."""
    view = memoryview(raw)
    data: memoryview | None = None
    cut = (0, 0)  # where the data field (tag to end) sits in raw
    at = 0
    while at < len(view):
        start = at
        key, at = _read_varint(view, at)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise RowStreamError("field number 0")
        if wire_type == 0:
            _, at = _read_varint(view, at)
        elif wire_type == _LENGTH_DELIMITED:
            length, at = _read_varint(view, at)
            if length > len(view) - at:
                raise RowStreamError(f"a field of {length} bytes runs past the message")
            if field == _DATA_FIELD:
                if data is not None:
                    raise RowStreamError("more than one data field")
                data, cut = view[at : at + length], (start, at + length)
            at += length
        elif wire_type in _FIXED_SIZE:
            at += _FIXED_SIZE[wire_type]
            if at > len(view):
                raise RowStreamError("truncated fixed-size field")
        else:
            raise RowStreamError(f"wire type {wire_type} (groups are not used)")
        if field == _DATA_FIELD and wire_type != _LENGTH_DELIMITED:
            raise RowStreamError(f"data has wire type {wire_type}")
    if data is None:
        raise RowStreamError("no data field")
    rest = bytes(view[: cut[0]]) + bytes(view[cut[1] :])  # the small fields only
    try:
        head = encoder_pb2.EmbeddingRows.FromString(rest)
    except DecodeError as error:
        raise RowStreamError(f"malformed fields: {error}") from None
    return head, data
