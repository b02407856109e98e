"""The Redis value of one item's embedding rows: a header, then the rows, in one string.

One string per item means one SET writes it atomically, and any row range can be read
with GETRANGE without reading the rest. The header and each group of `group_rows` rows
carry a tag (`entry_mac`: a keyed MAC when encoders share a key, a checksum otherwise),
so a partial read is verified on its own.

Layout (all integers little-endian):

    offset  size  field
    0       4     magic b"TSEM"
    4       2     format version (u16, currently 2)
    6       1     dtype code (u8): 1 float32, 2 float16, 3 bfloat16
    7       2     group_rows (u16): rows per tag group
    9       4     num_rows (u32)
    13      4     hidden_size (u32)
    17      8     rows byte count (u64) = num_rows * hidden_size * itemsize
    25      16    header tag: over the binding and the 25 bytes above
    41      16*G  group tags: one per row group, G groups
    41+16G  ...   the rows, row-major, exactly `rows byte count` bytes

G = ceil(num_rows / group_rows); the last group may hold fewer rows. Group g's tag covers
the binding bytes (the Redis key, so a value copied under another key fails), the 25
fixed header bytes (so a changed dtype/shape fails even when sizes still agree, e.g.
float16 <-> bfloat16), the group index (so a group moved to another slot fails) and the
group's bytes. The header tag lets a reader trust the header (and the shape it states)
before it reads any row.

Version 1 (8-byte unkeyed digests, no header tag) is not read: its entries live under
other Redis key names, so they are misses that expire with their TTL.

Worked example: LLaVA-1.5-7B rows, 576 x 4096 float16 (row = 8192 bytes), group_rows 16:

    G = 36 groups, header length = 41 + 36 * 16 = 617, value length = 617 + 4718592.
    Rows [100, 130) lie in groups 6..8 (100 // 16 = 6, 129 // 16 = 8):
      tags: bytes 41 + 6*16 = 137 .. 41 + 9*16 - 1 = 184             (GETRANGE 137 184)
      rows: bytes 617 + 96*8192 = 787049 .. 617 + 144*8192 - 1 = 1180264
            (rows 96..143: 48 rows read and verified, rows 100..129 returned)
    Rows [570, 576) lie in group 35, rows 560..575: bytes 4588137 .. 4719208.

Pure functions only; nothing here touches Redis.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass

from encoder_service.entry_mac import MAC_BYTES, UNKEYED, EntryMac
from tessera.tensor_codec import CodecError, RowBlock, check_block, itemsize

MAGIC = b"TSEM"
FORMAT_VERSION = 2
DEFAULT_GROUP_ROWS = 16

_FIXED = struct.Struct("<4sHBHIIQ")
FIXED_HEADER_BYTES = _FIXED.size  # 25
# What a reader fetches to learn, and trust, an entry's layout: fixed part + its tag.
HEADER_BYTES = FIXED_HEADER_BYTES + MAC_BYTES  # 41

DTYPE_CODES: dict[str, int] = {"float32": 1, "float16": 2, "bfloat16": 3}
_DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}
_MAX_U16 = (1 << 16) - 1
_MAX_U32 = (1 << 32) - 1


class CorruptEntryError(ValueError):
    """A stored value whose header, length, tags or shape are not what they must be."""


@dataclass(frozen=True)
class RowShape:
    """What every row of the model's items is: `hidden_size` values of `dtype` (for
    families with several planes, the whole row: planes * hidden size)."""

    hidden_size: int
    dtype: str


@dataclass(frozen=True)
class EntryHeader:
    """The fixed header fields of one stored entry."""

    dtype: str
    group_rows: int
    num_rows: int
    hidden_size: int
    rows_bytes: int

    @property
    def row_bytes(self) -> int:
        return self.hidden_size * itemsize(self.dtype)

    @property
    def num_groups(self) -> int:
        return -(-self.num_rows // self.group_rows)

    @property
    def header_length(self) -> int:
        return HEADER_BYTES + MAC_BYTES * self.num_groups

    @property
    def value_length(self) -> int:
        """Exact byte length of the whole stored value."""
        return self.header_length + self.rows_bytes

    def packed(self) -> bytes:
        """The 25 fixed header bytes (what every tag binds)."""
        return _FIXED.pack(
            MAGIC,
            FORMAT_VERSION,
            DTYPE_CODES[self.dtype],
            self.group_rows,
            self.num_rows,
            self.hidden_size,
            self.rows_bytes,
        )

    def group_rows_range(self, group: int) -> tuple[int, int]:
        """Rows `[start, end)` held by `group`; the last group may be short."""
        start = group * self.group_rows
        return start, min(start + self.group_rows, self.num_rows)


def header_length(header: EntryHeader) -> int:
    """Bytes before the first row: the fixed part, its tag and the group tags."""
    return header.header_length


def parse_fixed_header(data: bytes) -> EntryHeader:
    """The header fields in the first 25 bytes of `data` (more may follow), checked for
    consistency only: nothing here says who wrote them (see `parse_header`).

    Raises CorruptEntryError on a short buffer, bad magic, unknown version or dtype,
    zero sizes, or a rows byte count that does not match the shape.
    """
    if len(data) < FIXED_HEADER_BYTES:
        raise CorruptEntryError(f"value of {len(data)} bytes is shorter than the header")
    magic, version, code, group_rows, num_rows, hidden, rows_bytes = _FIXED.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntryError(f"bad magic {magic!r}")
    if version != FORMAT_VERSION:
        raise CorruptEntryError(f"unsupported format version {version}")
    dtype = _DTYPE_NAMES.get(code)
    if dtype is None:
        raise CorruptEntryError(f"unknown dtype code {code}")
    if min(group_rows, num_rows, hidden) < 1:
        raise CorruptEntryError(
            f"zero size: group_rows={group_rows} num_rows={num_rows} hidden={hidden}"
        )
    if rows_bytes != num_rows * hidden * itemsize(dtype):
        raise CorruptEntryError(f"{rows_bytes} row bytes do not fit {num_rows} x {hidden} {dtype}")
    return EntryHeader(dtype, group_rows, num_rows, hidden, rows_bytes)


def parse_header(
    data: bytes,
    binding: bytes = b"",
    mac: EntryMac = UNKEYED,
    expected: RowShape | None = None,
) -> EntryHeader:
    """The header in the first 41 bytes of `data` (more may follow): consistent, its tag
    right for `binding` under `mac`, and its rows of the `expected` shape.

    Raises CorruptEntryError otherwise. A tag made without the key fails here, before
    any row is read.
    """
    if len(data) < HEADER_BYTES:
        raise CorruptEntryError(f"value of {len(data)} bytes is shorter than the header")
    header = parse_fixed_header(data)
    stored = data[FIXED_HEADER_BYTES:HEADER_BYTES]
    if not hmac.compare_digest(mac.header_tag(binding, header.packed()), stored):
        raise CorruptEntryError(f"header {mac.kind} mismatch")
    if expected is not None and (header.hidden_size, header.dtype) != (
        expected.hidden_size,
        expected.dtype,
    ):
        raise CorruptEntryError(
            f"rows of {header.hidden_size} x {header.dtype}; the model's are "
            f"{expected.hidden_size} x {expected.dtype}"
        )
    return header


def encode_entry(
    block: RowBlock,
    group_rows: int = DEFAULT_GROUP_ROWS,
    binding: bytes = b"",
    mac: EntryMac = UNKEYED,
) -> bytes:
    """The stored value of `block`: header, its tag, the group tags, rows.

    `binding` (the Redis key) is mixed into every tag; pass the same bytes and `mac` to
    `parse_header`, `verify_groups` and `decode_entry`.
    """
    check_block(block.dtype, (block.num_rows, block.hidden_size), len(block.data))
    if not 1 <= group_rows <= _MAX_U16:
        raise CodecError(f"group_rows must be in [1, {_MAX_U16}], got {group_rows}")
    if block.num_rows > _MAX_U32 or block.hidden_size > _MAX_U32:
        raise CodecError(f"shape {block.num_rows} x {block.hidden_size} exceeds u32")
    header = EntryHeader(
        block.dtype, group_rows, block.num_rows, block.hidden_size, len(block.data)
    )
    fixed = header.packed()
    tagger = mac.group_tagger(binding, fixed)
    rows = memoryview(block.data)
    group_bytes = group_rows * header.row_bytes
    tags = b"".join(
        tagger.tag(group, rows[group * group_bytes : (group + 1) * group_bytes])
        for group in range(header.num_groups)
    )
    return b"".join([fixed, mac.header_tag(binding, fixed), tags, block.data])


def row_range_for(header: EntryHeader, start: int, end: int) -> tuple[int, int, int, int]:
    """Where the groups covering rows `[start, end)` lie in the value.

    Returns `(byte_start, byte_end_inclusive, first_group, last_group)`: the byte range
    is inclusive at both ends, as GETRANGE takes it. See the module docstring for a
    worked example.
    """
    if not 0 <= start < end <= header.num_rows:
        raise CodecError(f"rows [{start}, {end}) outside [0, {header.num_rows})")
    first_group = start // header.group_rows
    last_group = (end - 1) // header.group_rows
    first_row = header.group_rows_range(first_group)[0]
    end_row = header.group_rows_range(last_group)[1]
    byte_start = header.header_length + first_row * header.row_bytes
    byte_end = header.header_length + end_row * header.row_bytes - 1
    return byte_start, byte_end, first_group, last_group


def tag_range_for(header: EntryHeader, first_group: int, last_group: int) -> tuple[int, int]:
    """Inclusive byte range of the tags of groups `first_group..last_group`."""
    if not 0 <= first_group <= last_group < header.num_groups:
        raise CodecError(f"groups {first_group}..{last_group} outside [0, {header.num_groups})")
    start = HEADER_BYTES + MAC_BYTES * first_group
    return start, HEADER_BYTES + MAC_BYTES * (last_group + 1) - 1


def verify_groups(
    header: EntryHeader,
    tags: bytes,
    group_bytes: bytes,
    first_group: int,
    binding: bytes = b"",
    mac: EntryMac = UNKEYED,
) -> None:
    """Checks consecutive groups starting at `first_group` against their tags.

    `tags` holds one tag per group; `group_bytes` the groups' rows back to back and
    nothing else. Raises CorruptEntryError on any length or tag mismatch.
    """
    num, remainder = divmod(len(tags), MAC_BYTES)
    if remainder or num == 0 or not 0 <= first_group <= first_group + num <= header.num_groups:
        raise CorruptEntryError(
            f"{len(tags)} tag bytes do not name groups from {first_group} of {header.num_groups}"
        )
    first_row = header.group_rows_range(first_group)[0]
    end_row = header.group_rows_range(first_group + num - 1)[1]
    expected = (end_row - first_row) * header.row_bytes
    if len(group_bytes) != expected:
        raise CorruptEntryError(f"{len(group_bytes)} group bytes, expected {expected}")
    tagger = mac.group_tagger(binding, header.packed())
    view = memoryview(group_bytes)
    size = header.group_rows * header.row_bytes
    for i in range(num):
        actual = tagger.tag(first_group + i, view[i * size : (i + 1) * size])
        stored = tags[i * MAC_BYTES : (i + 1) * MAC_BYTES]
        if not hmac.compare_digest(actual, stored):
            raise CorruptEntryError(f"{mac.kind} mismatch in row group {first_group + i}")


def rows_from_groups(
    header: EntryHeader, group_bytes: bytes, first_group: int, start: int, end: int
) -> RowBlock:
    """Rows `[start, end)` cut out of (verified) groups that begin at `first_group`."""
    offset = start - header.group_rows_range(first_group)[0]
    if offset < 0 or (end - start + offset) * header.row_bytes > len(group_bytes):
        raise CodecError(f"rows [{start}, {end}) are not inside the groups given")
    row_bytes = header.row_bytes
    # A view: the groups are this read's own, at most a group's rows more on either side.
    data = memoryview(group_bytes)[offset * row_bytes : (offset + end - start) * row_bytes]
    return RowBlock(header.dtype, end - start, header.hidden_size, data)


def decode_entry(
    data: bytes,
    binding: bytes = b"",
    mac: EntryMac = UNKEYED,
    expected: RowShape | None = None,
) -> RowBlock:
    """The whole stored value back to a RowBlock: header and every group verified, exact
    length, rows of the expected shape."""
    header = parse_header(data, binding, mac, expected)
    if len(data) != header.value_length:
        raise CorruptEntryError(f"value is {len(data)} bytes, header says {header.value_length}")
    view = memoryview(data)
    tags = bytes(view[HEADER_BYTES : header.header_length])
    rows = bytes(view[header.header_length :])
    verify_groups(header, tags, rows, 0, binding, mac)
    return RowBlock(header.dtype, header.num_rows, header.hidden_size, rows)
