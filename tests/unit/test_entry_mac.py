"""Keyed entries (issue 13): what an encoder holding the fleet's key writes, nobody without
the key can forge or move to another key name, and a header must state the model's row
shape. Pure: no Redis here (tests/service/test_redis_security.py has the real thing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from encoder_service.entry_mac import MIN_KEY_FILE_BYTES, EntryMac, MacKeyError
from encoder_service.redis_format import (
    HEADER_BYTES,
    CorruptEntryError,
    RowShape,
    decode_entry,
    encode_entry,
    parse_header,
    row_range_for,
    rows_from_groups,
    tag_range_for,
    verify_groups,
)
from tessera.tensor_codec import RowBlock, encode_rows

KEY = b"tessera:emb:v2:1234abcd:fp:abc"
SECRET = b"8d1f0c3e5a7b9d2f4e6a8c0b1d3f5e7a"  # 32 bytes, as `openssl rand -hex 16` prints


def block_of(num_rows: int, hidden: int, dtype: str = "float16", seed: int = 0) -> RowBlock:
    generator = torch.Generator().manual_seed(seed)
    return encode_rows(torch.randn(num_rows, hidden, generator=generator).to(getattr(torch, dtype)))


def mac_from(tmp_path: Path, secret: bytes = SECRET, name: str = "key") -> EntryMac:
    path = tmp_path / name
    path.write_bytes(secret)
    return EntryMac.from_file(path)


def partial_read(value: bytes, start: int, end: int, mac: EntryMac, binding: bytes = KEY):
    """get_rows' read path on an in-memory value: the header, then only the groups."""
    header = parse_header(value[:HEADER_BYTES], binding, mac)
    byte_start, byte_end, first, last = row_range_for(header, start, end)
    tags_start, tags_end = tag_range_for(header, first, last)
    groups = value[byte_start : byte_end + 1]
    verify_groups(header, value[tags_start : tags_end + 1], groups, first, binding, mac)
    return rows_from_groups(header, groups, first, start, end)


def test_keyed_entries_round_trip_whole_and_in_part(tmp_path: Path) -> None:
    mac = mac_from(tmp_path)
    block = block_of(50, 6)
    value = encode_entry(block, group_rows=16, binding=KEY, mac=mac)
    assert decode_entry(value, KEY, mac) == block
    assert partial_read(value, 20, 40, mac) == block.rows(20, 40)


def test_valid_unkeyed_checksums_are_not_a_valid_mac(tmp_path: Path) -> None:
    """The issue's probe: a forger who can write to Redis stores rows of their choosing
    with correct unkeyed checksums. Refused at the header, before any row is read; and
    the forger's group tags fail on their own too, even behind an honest header."""
    mac = mac_from(tmp_path)
    honest = encode_entry(block_of(50, 6, seed=1), binding=KEY, mac=mac)
    forged = encode_entry(block_of(50, 6, seed=2), binding=KEY)
    assert decode_entry(forged, KEY) == block_of(50, 6, seed=2), "valid checksums"
    with pytest.raises(CorruptEntryError, match="header MAC mismatch"):
        decode_entry(forged, KEY, mac)
    with pytest.raises(CorruptEntryError, match="header MAC mismatch"):
        partial_read(forged, 20, 22, mac)
    spliced = honest[:HEADER_BYTES] + forged[HEADER_BYTES:]
    with pytest.raises(CorruptEntryError, match="MAC mismatch in row group 0"):
        decode_entry(spliced, KEY, mac)
    with pytest.raises(CorruptEntryError, match="MAC mismatch in row group 1"):
        partial_read(spliced, 20, 22, mac)


def test_a_keyed_entry_fails_under_another_key_name_mac_key_or_none(tmp_path: Path) -> None:
    mac = mac_from(tmp_path)
    value = encode_entry(block_of(20, 4), binding=KEY, mac=mac)
    other_name = KEY[:-1] + b"d"  # another content hash of the same length
    other_mac = mac_from(tmp_path, SECRET[::-1], "other")
    for binding, reader in [(other_name, mac), (KEY, other_mac), (KEY, EntryMac())]:
        with pytest.raises(CorruptEntryError, match="mismatch"):
            decode_entry(value, binding, reader)
        with pytest.raises(CorruptEntryError, match="mismatch"):
            partial_read(value, 0, 3, reader, binding)


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        ((24, "float16"), "width"),
        ((16, "bfloat16"), "dtype of the same itemsize"),
        ((8, "float32"), "dtype of the same row bytes"),
    ],
)
def test_a_header_must_state_the_models_row_shape(
    tmp_path: Path, stored: tuple[int, str], reason: str
) -> None:
    """Even with a valid MAC (written by a misconfigured encoder holding the key), an
    entry of another shape than the model's is corrupt."""
    mac = mac_from(tmp_path)
    model = RowShape(16, "float16")
    hidden, dtype = stored
    value = encode_entry(block_of(10, hidden, dtype), binding=KEY, mac=mac)
    expected = f"rows of {hidden} x {dtype}; the model's are 16 x float16"
    with pytest.raises(CorruptEntryError, match=expected):
        parse_header(value, KEY, mac, model)
    with pytest.raises(CorruptEntryError, match=expected):
        decode_entry(value, KEY, mac, model)
    right = encode_entry(block_of(10, 16, "float16"), binding=KEY, mac=mac)
    assert decode_entry(right, KEY, mac, model) == block_of(10, 16, "float16")


def test_key_files(tmp_path: Path) -> None:
    mac = mac_from(tmp_path)
    assert mac.keyed and mac.kind == "MAC"
    assert mac_from(tmp_path, SECRET + b"\n", "newline") == mac, "a trailing newline is ignored"
    assert SECRET.hex() not in repr(mac) and repr(mac.key) not in repr(mac)
    other = mac_from(tmp_path, SECRET[::-1], "other")
    assert len(mac.key_id) == 8 and mac.key_id != other.key_id
    assert EntryMac().key_id == "open" and not EntryMac().keyed
    with pytest.raises(MacKeyError, match=f"at least {MIN_KEY_FILE_BYTES}"):
        mac_from(tmp_path, SECRET[:-1], "short")
    with pytest.raises(MacKeyError, match="cannot read"):
        EntryMac.from_file(tmp_path / "missing")
