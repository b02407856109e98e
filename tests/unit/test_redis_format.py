"""The Redis value format: exact byte offsets for row-range reads, every kind of damage
detected (invariant 4), keyed MACs that no one without the key can forge, and the
model's row shape enforced. Pure: no Redis here."""

from __future__ import annotations

import random
import struct

import pytest
import torch

from encoder_service.entry_mac import MAC_BYTES, EntryMac
from encoder_service.redis_format import (
    FIXED_HEADER_BYTES,
    HEADER_BYTES,
    CorruptEntryError,
    EntryHeader,
    decode_entry,
    encode_entry,
    header_length,
    parse_fixed_header,
    parse_header,
    row_range_for,
    rows_from_groups,
    tag_range_for,
    verify_groups,
)
from tessera.tensor_codec import CodecError, RowBlock, encode_rows

KEY = b"tessera:emb:v2:open:fp:abc"
UNKEYED = EntryMac()


def block_of(num_rows: int, hidden: int, dtype: str = "float16", seed: int = 0) -> RowBlock:
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn(num_rows, hidden, generator=generator).to(getattr(torch, dtype))
    return encode_rows(tensor)


def read_range(value: bytes, start: int, end_inclusive: int) -> bytes:
    """What GETRANGE start end_inclusive returns."""
    return value[start : end_inclusive + 1]


def partial_read(
    value: bytes, start: int, end: int, binding: bytes = KEY, mac: EntryMac = UNKEYED
) -> RowBlock:
    """get_rows' read path on an in-memory value."""
    header = parse_header(value[:HEADER_BYTES], binding, mac)
    byte_start, byte_end, first, last = row_range_for(header, start, end)
    tags = read_range(value, *tag_range_for(header, first, last))
    groups = read_range(value, byte_start, byte_end)
    verify_groups(header, tags, groups, first, binding, mac)
    return rows_from_groups(header, groups, first, start, end)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("num_rows", [1, 15, 16, 17, 50])
def test_round_trip(dtype: str, num_rows: int) -> None:
    block = block_of(num_rows, 8, dtype)
    value = encode_entry(block, group_rows=16, binding=KEY)
    header = parse_fixed_header(value)
    assert header == EntryHeader(dtype, 16, num_rows, 8, len(block.data))
    assert len(value) == header_length(header) + len(block.data)
    assert decode_entry(value, KEY) == block


def test_layout_matches_the_documented_example() -> None:
    """576 x 4096 float16, groups of 16: the numbers in the module docstring."""
    header = EntryHeader("float16", 16, 576, 4096, 576 * 4096 * 2)
    assert header.num_groups == 36
    assert header_length(header) == 617
    assert row_range_for(header, 100, 130) == (787049, 1180264, 6, 8)
    assert tag_range_for(header, 6, 8) == (137, 184)
    assert row_range_for(header, 570, 576) == (4588137, 4719208, 35, 35)


def test_fixed_header_bytes() -> None:
    value = encode_entry(block_of(3, 2, "bfloat16"), group_rows=2)
    assert value[:FIXED_HEADER_BYTES] == struct.pack("<4sHBHIIQ", b"TSEM", 2, 3, 2, 3, 2, 12)
    # the header's tag, 2 groups -> 2 tags, then the rows
    assert HEADER_BYTES == FIXED_HEADER_BYTES + MAC_BYTES == 41
    assert len(value) == HEADER_BYTES + 2 * MAC_BYTES + 12


# (start, end) -> expected (first_group, last_group) for 50 rows in groups of 16
RANGES = {
    "start": ((0, 5), (0, 0)),
    "middle inside one group": ((18, 30), (1, 1)),
    "whole group": ((16, 32), (1, 1)),
    "across groups": ((10, 40), (0, 2)),
    "end (the short last group)": ((48, 50), (3, 3)),
    "end across groups": ((45, 50), (2, 3)),
    "one row at the end": ((49, 50), (3, 3)),
    "everything": ((0, 50), (0, 3)),
}


@pytest.mark.parametrize("name", list(RANGES))
def test_row_ranges_read_exactly_their_groups(name: str) -> None:
    (start, end), (first, last) = RANGES[name]
    block = block_of(50, 6, "float32")  # row = 24 bytes
    value = encode_entry(block, group_rows=16, binding=KEY)
    header = parse_fixed_header(value)
    hl = HEADER_BYTES + 4 * MAC_BYTES
    assert header_length(header) == hl
    byte_start, byte_end, first_group, last_group = row_range_for(header, start, end)
    assert (first_group, last_group) == (first, last)
    assert byte_start == hl + first * 16 * 24
    assert byte_end == hl + min((last + 1) * 16, 50) * 24 - 1
    groups = read_range(value, byte_start, byte_end)
    assert groups == block.data[first * 16 * 24 : min((last + 1) * 16, 50) * 24]
    assert partial_read(value, start, end) == block.rows(start, end)


@pytest.mark.parametrize("bad", [(-1, 3), (3, 3), (5, 2), (0, 51)])
def test_row_range_outside_is_rejected(bad: tuple[int, int]) -> None:
    header = parse_fixed_header(encode_entry(block_of(50, 6)))
    with pytest.raises(CodecError):
        row_range_for(header, *bad)


@pytest.mark.parametrize("group", [0, 1, 2, 3])
def test_flipped_byte_in_any_row_group_is_detected(group: int) -> None:
    value = bytearray(encode_entry(block_of(50, 6, "float32"), group_rows=16, binding=KEY))
    header = parse_fixed_header(value)
    rng = random.Random(group)
    first_row, end_row = header.group_rows_range(group)
    position = header_length(header) + rng.randrange(first_row * 24, end_row * 24)
    value[position] ^= 1 << rng.randrange(8)
    with pytest.raises(CorruptEntryError, match=f"group {group}"):
        decode_entry(bytes(value), KEY)
    # a partial read of that group alone fails too, and one of another group does not
    with pytest.raises(CorruptEntryError):
        partial_read(bytes(value), first_row, end_row)
    other = (group + 1) % 4
    partial_read(bytes(value), *header.group_rows_range(other))


@pytest.mark.parametrize("position", range(HEADER_BYTES + 4 * MAC_BYTES))
def test_flipped_byte_in_the_header_is_detected(position: int) -> None:
    """Every header byte, fixed part, its tag and the group tags, for one bit each."""
    value = bytearray(encode_entry(block_of(50, 6, "float32"), group_rows=16, binding=KEY))
    value[position] ^= 1 << (position % 8)
    with pytest.raises(CorruptEntryError):
        decode_entry(bytes(value), KEY)


def test_float16_bfloat16_swap_in_header_is_detected() -> None:
    """Same itemsize, so every size still agrees: only the tags' binding catches it."""
    value = bytearray(encode_entry(block_of(20, 4, "float16"), binding=KEY))
    value[6] = 3  # bfloat16
    header = parse_fixed_header(value)  # parses fine
    assert header.dtype == "bfloat16"
    with pytest.raises(CorruptEntryError, match="header checksum mismatch"):
        decode_entry(bytes(value), KEY)
    with pytest.raises(CorruptEntryError, match="header checksum mismatch"):
        partial_read(bytes(value), 3, 5)


@pytest.mark.parametrize("cut", [1, 24, 25, 100])
def test_truncated_value_is_detected(cut: int) -> None:
    value = encode_entry(block_of(50, 6, "float32"), binding=KEY)
    with pytest.raises(CorruptEntryError):
        decode_entry(value[:-cut], KEY)
    with pytest.raises(CorruptEntryError):
        decode_entry(value + b"\0", KEY)


@pytest.mark.parametrize("code", [0, 4, 255])
def test_wrong_dtype_code_is_detected(code: int) -> None:
    value = bytearray(encode_entry(block_of(4, 4)))
    value[6] = code
    with pytest.raises(CorruptEntryError, match="dtype"):
        parse_fixed_header(value)


@pytest.mark.parametrize(
    ("field", "offset", "packed"),
    [
        ("magic", 0, b"XSEM"),
        ("version 1 (8-byte digests, no header tag)", 4, struct.pack("<H", 1)),
        ("version 3", 4, struct.pack("<H", 3)),
        ("group_rows", 7, struct.pack("<H", 0)),
        ("num_rows", 9, struct.pack("<I", 0)),
        ("hidden", 13, struct.pack("<I", 0)),
        ("rows bytes", 17, struct.pack("<Q", 7)),
    ],
)
def test_bad_fixed_fields_are_rejected(field: str, offset: int, packed: bytes) -> None:
    value = bytearray(encode_entry(block_of(4, 4)))
    value[offset : offset + len(packed)] = packed
    with pytest.raises(CorruptEntryError):
        parse_fixed_header(value)


@pytest.mark.parametrize("garbage", [b"", b"TSEM", b"\0" * 25, b"hello world" * 10])
def test_garbage_is_rejected(garbage: bytes) -> None:
    with pytest.raises(CorruptEntryError):
        decode_entry(garbage)


def test_group_swapped_from_another_entry_is_detected() -> None:
    """Same shape, dtype and key: group 1 and its tag copied from another entry's
    group 2 — the index binding catches it; group 1 with its tag copied from an entry
    under another key — the key binding catches it."""
    mine = bytearray(encode_entry(block_of(50, 6, "float32", seed=1), binding=KEY))
    theirs = encode_entry(block_of(50, 6, "float32", seed=2), binding=KEY)
    header = parse_fixed_header(mine)
    hl, size = header_length(header), 16 * 24

    def swap(dst: int, src_value: bytes, src: int) -> bytes:
        value = bytearray(mine)
        value[hl + dst * size : hl + (dst + 1) * size] = src_value[
            hl + src * size : hl + (src + 1) * size
        ]
        d, s = HEADER_BYTES + dst * MAC_BYTES, HEADER_BYTES + src * MAC_BYTES
        value[d : d + MAC_BYTES] = src_value[s : s + MAC_BYTES]
        return bytes(value)

    for value in (swap(1, theirs, 2), swap(1, bytes(mine), 2)):
        with pytest.raises(CorruptEntryError, match="group 1"):
            decode_entry(value, KEY)
        with pytest.raises(CorruptEntryError):
            partial_read(value, 16, 32)
    # a key of the same length, so only its bytes differ
    other_key = encode_entry(block_of(50, 6, "float32", seed=2), binding=KEY[:-1] + b"d")
    with pytest.raises(CorruptEntryError, match="group 1"):
        decode_entry(swap(1, other_key, 1), KEY)
    # and a whole value stored under the wrong key fails as a whole
    with pytest.raises(CorruptEntryError):
        decode_entry(other_key, KEY)


def test_group_from_an_entry_of_another_shape_is_detected() -> None:
    """Bytes and tag at the same index of an entry with other header fields."""
    mine = bytearray(encode_entry(block_of(50, 6, "float32", seed=1), binding=KEY))
    # 48 rows: same group 0 bytes length, different num_rows in the bound header
    theirs = encode_entry(block_of(48, 6, "float32", seed=1), binding=KEY)
    header = parse_fixed_header(mine)
    hl = header_length(header)
    their_hl = header_length(parse_fixed_header(theirs))
    mine[hl : hl + 16 * 24] = theirs[their_hl : their_hl + 16 * 24]
    mine[HEADER_BYTES : HEADER_BYTES + MAC_BYTES] = theirs[HEADER_BYTES : HEADER_BYTES + MAC_BYTES]
    assert bytes(mine[hl : hl + 16 * 24]) == block_of(50, 6, "float32", seed=1).data[: 16 * 24]
    with pytest.raises(CorruptEntryError, match="group 0"):
        decode_entry(bytes(mine), KEY)


def test_verify_groups_rejects_wrong_lengths() -> None:
    value = encode_entry(block_of(50, 6, "float32"), binding=KEY)
    header = parse_fixed_header(value)
    byte_start, byte_end, first, last = row_range_for(header, 0, 20)
    sums = read_range(value, *tag_range_for(header, first, last))
    groups = read_range(value, byte_start, byte_end)
    verify_groups(header, sums, groups, first, KEY)
    for bad_sums, bad_groups, bad_first in [
        (sums[:-1], groups, first),  # partial tag
        (sums, groups[:-1], first),  # short groups
        (sums, groups + b"\0", first),  # extra bytes
        (b"", b"", first),  # nothing
        (sums, groups, 3),  # past the last group
    ]:
        with pytest.raises(CorruptEntryError):
            verify_groups(header, bad_sums, bad_groups, bad_first, KEY)


def test_encode_rejects_inconsistent_blocks() -> None:
    with pytest.raises(CodecError):
        encode_entry(RowBlock("float32", 2, 3, bytes(23)))
    with pytest.raises(CodecError):
        encode_entry(block_of(2, 2), group_rows=0)
    with pytest.raises(CodecError):
        encode_entry(block_of(2, 2), group_rows=1 << 16)
