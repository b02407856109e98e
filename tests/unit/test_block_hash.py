"""Block hashes for prefix caching: a block's hash names its tokens, every media row it
holds (which item, which row, where in the block) and everything before it, so two blocks
share a hash only when their K/V are the same."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from decoder_service.block_hash import block_hashes
from tessera.placeholders import Modality, PlaceholderRange

PLACEHOLDER = 9
IMAGE_A = "ab" * 32
IMAGE_B = "cd" * 32


def image(offset: int, length: int, content_hash: str = IMAGE_A) -> PlaceholderRange:
    return PlaceholderRange(Modality.IMAGE, content_hash, offset, length)


def prompt_with(num_tokens: int, ranges: list[PlaceholderRange], seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    tokens = [rng.randrange(10, 1000) for _ in range(num_tokens)]
    for item in ranges:
        tokens[item.offset : item.end] = [PLACEHOLDER] * item.length
    return tokens


def first_difference(a: list[bytes], b: list[bytes]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


@pytest.mark.parametrize("block_size", [1, 3, 4, 16])
def test_only_full_blocks_are_hashed(block_size):
    for num_tokens in range(0, 40):
        hashes = block_hashes(list(range(num_tokens)), [], block_size)
        assert len(hashes) == num_tokens // block_size
        assert all(isinstance(h, bytes) and len(h) == 16 for h in hashes)
    assert len(set(block_hashes(list(range(64)), [], block_size))) == 64 // block_size


def test_a_partial_block_does_not_change_the_full_ones():
    tokens = list(range(10, 30))
    assert block_hashes(tokens[:18], [], 4) == block_hashes(tokens[:16], [], 4)
    assert block_hashes(tokens[:18], [], 4) == block_hashes([*tokens[:18], 7], [], 4)


def test_same_inputs_give_same_hashes():
    ranges = [image(3, 7), image(12, 5, IMAGE_B)]
    tokens = prompt_with(30, ranges)
    first = block_hashes(tokens, ranges, 4, salt="s")
    assert block_hashes(list(tokens), list(ranges), 4, salt="s") == first
    assert block_hashes(tuple(tokens), tuple(ranges), 4, salt="s") == first


@pytest.mark.parametrize("block_size", [1, 2, 4, 5])
def test_incremental_hashing_equals_full_recompute(block_size):
    ranges = [image(2, 9), image(14, 6, IMAGE_B)]
    tokens = prompt_with(37, ranges)
    full = block_hashes(tokens, ranges, block_size, salt="x")
    for num_known in range(len(full) + 1):
        assert block_hashes(tokens, ranges, block_size, known=full[:num_known], salt="x") == full
    # Growing the sequence (as decoding does), reusing the hashes known so far.
    known: list[bytes] = []
    for num_tokens in range(len(tokens) + 1):
        known = block_hashes(tokens[:num_tokens], ranges, block_size, known=known, salt="x")
        assert known == full[: num_tokens // block_size]


def test_known_hashes_are_trusted_not_recomputed():
    """`known` is the chain so far: later blocks chain on its last hash."""
    tokens = list(range(100, 112))
    full = block_hashes(tokens, [], 4)
    fake = [b"\x00" * 16]
    derived = block_hashes(tokens, [], 4, known=fake)
    assert derived[0] == fake[0]
    assert derived[1:] != full[1:]


@pytest.mark.parametrize("position", [0, 5, 7, 8, 13, 23])
def test_one_changed_token_changes_its_block_and_every_later_one(position):
    block_size = 4
    tokens = list(range(10, 34))
    changed = list(tokens)
    changed[position] += 1
    a, b = block_hashes(tokens, [], block_size), block_hashes(changed, [], block_size)
    block = position // block_size
    assert a[:block] == b[:block]
    assert all(x != y for x, y in zip(a[block:], b[block:], strict=True))


def test_same_text_after_another_prefix_never_matches():
    shared = list(range(50, 58))
    a = block_hashes([1, 2, 3, 4, *shared], [], 4)
    b = block_hashes([5, 6, 7, 8, *shared], [], 4)
    assert not set(a) & set(b)


def test_same_image_at_another_offset_changes_the_blocks_it_covers():
    """Shift the prompt by one text token after block 0: the image sits one position
    later."""
    text = list(range(100, 106))
    tail = list(range(200, 210))
    first = image(6, 8)
    shifted = image(7, 8)
    tokens_a = text + [PLACEHOLDER] * 8 + tail
    tokens_b = text + [999] + [PLACEHOLDER] * 8 + tail[:-1]  # same length
    assert len(tokens_a) == len(tokens_b)
    a = block_hashes(tokens_a, [first], 4)
    b = block_hashes(tokens_b, [shifted], 4)
    # Block 0 ([0, 4)) holds text only and is the same; block 1 ([4, 8)) is where the
    # image starts, and it and everything after differ.
    assert a[0] == b[0]
    assert first_difference(a, b) == 1
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))


def test_moving_only_the_range_over_identical_tokens_changes_the_hashes():
    """The placeholder tokens are the same; only the range says which rows sit where."""
    tokens = [1, 2, 3, 4] + [PLACEHOLDER] * 12
    a = block_hashes(tokens, [image(5, 10)], 4)
    b = block_hashes(tokens, [image(6, 10)], 4)
    assert a[0] == b[0]
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))


@pytest.mark.parametrize(
    ("range_a", "range_b", "what"),
    [
        (image(0, 8), image(4, 4), "first row of the item in the block"),
        (image(5, 3), image(4, 3), "position of the rows in the block"),
        (image(4, 2), image(4, 3), "number of rows in the block"),
    ],
)
def test_each_field_of_a_media_row_run_is_hashed(range_a, range_b, what):
    """Same parent, same tokens in block 1 (`known` pins the parent): only the rows
    differ, so the hash must."""
    tokens = [PLACEHOLDER] * 8
    parent = [b"\x01" * 16]
    a = block_hashes(tokens, [range_a], 4, known=parent)
    b = block_hashes(tokens, [range_b], 4, known=parent)
    assert a[1] != b[1], what


def test_another_image_at_the_same_place_changes_the_blocks_it_covers_and_later():
    ranges_a = [image(9, 6, IMAGE_A)]
    ranges_b = [image(9, 6, IMAGE_B)]
    tokens = prompt_with(28, ranges_a)
    a = block_hashes(tokens, ranges_a, 4)
    b = block_hashes(tokens, ranges_b, 4)
    # The image covers positions [9, 15): blocks 2 and 3; block 0 and 1 are text.
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))


def test_two_items_in_one_block_are_both_hashed():
    tokens = [PLACEHOLDER] * 8
    base = block_hashes(tokens, [image(0, 2, IMAGE_A), image(2, 2, IMAGE_B)], 4)
    swapped = block_hashes(tokens, [image(0, 2, IMAGE_B), image(2, 2, IMAGE_A)], 4)
    second_changed = block_hashes(tokens, [image(0, 2, IMAGE_A), image(2, 2, IMAGE_A)], 4)
    assert base[0] != swapped[0]
    assert base[0] != second_changed[0]


def test_an_item_outside_a_block_does_not_change_it():
    tokens = prompt_with(16, [image(8, 4)])
    a = block_hashes(tokens, [image(8, 4)], 4)
    b = block_hashes(tokens, [image(8, 4, IMAGE_B)], 4)
    assert a[:2] == b[:2]
    assert a[2] != b[2]


def test_salt_separates_every_block():
    ranges = [image(3, 6)]
    tokens = prompt_with(24, ranges)
    plain = block_hashes(tokens, ranges, 4)
    salted = block_hashes(tokens, ranges, 4, salt="tenant-1")
    other = block_hashes(tokens, ranges, 4, salt="tenant-2")
    assert not set(plain) & set(salted)
    assert not set(salted) & set(other)
    assert block_hashes(tokens, ranges, 4, salt="tenant-1") == salted


def test_the_docstring_example():
    """block_size 4, an image at positions [2, 8):
    block 0: positions 0-3, rows 0-1 of the image at positions 2-3
    block 1: positions 4-7, rows 2-5 of the image at positions 4-7"""
    item = image(2, 6)
    tokens = [11, 12] + [PLACEHOLDER] * 6

    def h(parent: bytes, block_tokens: list[int], runs: list[tuple[int, int, int]]) -> bytes:
        # h_i = H(h_{i-1}, token_ids[block], [(content_hash, first_row, pos_in_block, num_rows)])
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(struct.pack("<4I", *block_tokens))
        for first_row, pos_in_block, num_rows in runs:
            digest.update(IMAGE_A.encode())
            digest.update(struct.pack("<III", first_row, pos_in_block, num_rows))
        return digest.digest()

    root = hashlib.blake2b(b"tessera-kv-block-v1", digest_size=16).digest()
    h0 = h(root, tokens[0:4], [(0, 2, 2)])
    h1 = h(h0, tokens[4:8], [(2, 0, 4)])
    assert block_hashes(tokens, [item], 4) == [h0, h1]
