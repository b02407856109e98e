"""EmbeddingRows messages written by hand are ordinary protobuf, and reading them back
takes the rows in place and refuses anything but well-formed fields with one `data`."""

from __future__ import annotations

import pytest

from tessera.row_stream import RowStreamError, decode_rows_message, encode_rows_message
from tessera.v1 import encoder_pb2

ROWS = bytes(range(256)) * 3


def test_a_written_message_is_what_protobuf_reads_and_the_rows_are_a_view():
    parts = [ROWS[:100], memoryview(ROWS)[100:700], bytearray(ROWS[700:])]
    raw = encode_rows_message(2**40 + 3, "bfloat16", 7, parts)
    parsed = encoder_pb2.EmbeddingRows.FromString(raw)
    assert (parsed.first_row, parsed.dtype, parsed.row_width) == (2**40 + 3, "bfloat16", 7)
    assert parsed.data == ROWS
    head, data = decode_rows_message(raw)
    assert (head.first_row, head.dtype, head.row_width) == (2**40 + 3, "bfloat16", 7)
    assert not head.data  # the rows are not copied into the parsed fields
    assert data.obj is raw and bytes(data) == ROWS


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16384, 1 << 21])
def test_rows_of_any_length_round_trip(size):
    rows = bytes(size)
    head, data = decode_rows_message(encode_rows_message(0, "float32", 1, [rows]))
    assert len(data) == size and head.dtype == "float32"


def test_fields_in_any_order_from_any_writer_are_read():
    """protobuf writes `data` where it likes; a reader must not depend on it being last."""
    message = encoder_pb2.EmbeddingRows(first_row=5, dtype="float16", row_width=3, data=ROWS)
    raw = message.SerializeToString()
    data_first = raw[raw.index(b"\x22") :] + raw[: raw.index(b"\x22")]
    for candidate in (raw, data_first):
        head, data = decode_rows_message(candidate)
        assert (head.first_row, head.dtype, head.row_width, bytes(data)) == (5, "float16", 3, ROWS)


GOOD = encode_rows_message(1, "float32", 2, [bytes(8)])


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "no data field"),
        (encoder_pb2.EmbeddingRows(first_row=1, dtype="float32").SerializeToString(), "no data"),
        (GOOD + b"\x22\x00", "more than one data field"),
        (GOOD[:-1], "runs past the message"),
        (b"\x08\x80", "truncated or overlong varint"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "truncated or overlong varint"),
        (GOOD + b"\x0b", "wire type 3"),  # a group start
        (b"\x20\x05" + GOOD, "data has wire type 0"),
        (b"\x02\x00" + GOOD, "field number 0"),
        (GOOD + b"\x0d\x00\x00", "truncated fixed-size field"),
        (b"\x12\x02\xff\xfe" + GOOD, "malformed fields"),  # dtype that is not UTF-8
    ],
)
def test_anything_but_one_well_formed_message_is_refused(raw, reason):
    with pytest.raises(RowStreamError, match=reason):
        decode_rows_message(raw)


def test_unknown_fields_are_skipped():
    """A newer encoder may add fields; an older reader keeps reading the rows."""
    extra = b"\x78\x07" + b"\x82\x01\x02ab" + b"\x89\x01" + bytes(8) + b"\x8d\x01" + bytes(4)
    head, data = decode_rows_message(extra + GOOD)
    assert head.first_row == 1 and bytes(data) == bytes(8)
