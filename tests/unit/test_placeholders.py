"""Chunk/item overlap math (invariant 1: half-open ranges, every row fetched exactly once,
none outside its chunk) and validation of placeholder ranges."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.placeholders import (
    ChunkSlice,
    Modality,
    PlaceholderRange,
    atomic_block_floor,
    atomic_chunk_end,
    chunk_bounds,
    overlap,
    slices_for_chunk,
    validate_ranges,
)

HASH = "ab" * 32
TEXT, IMAGE_ID, AUDIO_ID = 7, 3, 4
IMAGE_ONLY = {Modality.IMAGE: IMAGE_ID}


def image(offset: int, length: int, content_hash: str = HASH) -> PlaceholderRange:
    return PlaceholderRange(Modality.IMAGE, content_hash, offset, length)


@st.composite
def prompts_with_items(draw) -> tuple[int, list[PlaceholderRange], int]:
    """A prompt length, sorted disjoint (possibly touching) items inside it, a chunk size."""
    layout = draw(
        st.lists(st.tuples(st.integers(0, 10), st.integers(1, 30)), max_size=8)
    )  # (text tokens before the item, item length)
    items, position = [], 0
    for index, (gap, length) in enumerate(layout):
        items.append(image(position + gap, length, f"{index:064x}"))
        position += gap + length
    num_tokens = position + draw(st.integers(0 if items else 1, 10))
    chunk = draw(st.integers(min_value=1, max_value=num_tokens + 5))
    return num_tokens, items, chunk


@settings(deadline=None)  # no wall-clock limits on a busy 2-core machine
@given(prompts_with_items())
def test_chunk_bounds_tile_the_prompt(case):
    num_tokens, _, chunk = case
    bounds = list(chunk_bounds(num_tokens, chunk))
    assert bounds[0][0] == 0 and bounds[-1][1] == num_tokens
    for (_, end), (next_start, _) in itertools.pairwise(bounds):
        assert end == next_start
    assert all(0 < end - start <= chunk for start, end in bounds)


@settings(deadline=None)  # no wall-clock limits on a busy 2-core machine
@given(prompts_with_items())
def test_every_row_fetched_exactly_once_and_inside_its_chunk(case):
    num_tokens, items, chunk = case
    fetched: dict[int, list[int]] = {index: [] for index in range(len(items))}
    for start, end in chunk_bounds(num_tokens, chunk):
        for piece in slices_for_chunk(items, start, end):
            item = items[piece.item_index]
            assert piece.content_hash == item.content_hash
            assert piece.offset == item.offset
            assert 0 <= piece.row_start < piece.row_end <= item.length
            assert start <= piece.position_start < piece.position_end <= end
            assert piece.position_start == item.offset + piece.row_start
            assert piece.position_end == item.offset + piece.row_end
            assert piece.num_rows == piece.row_end - piece.row_start
            fetched[piece.item_index] += range(piece.row_start, piece.row_end)
    for index, item in enumerate(items):
        assert fetched[index] == list(range(item.length)), f"item {index}"


@settings(deadline=None)  # no wall-clock limits on a busy 2-core machine
@given(prompts_with_items())
def test_slices_come_in_prompt_order(case):
    num_tokens, items, chunk = case
    for start, end in chunk_bounds(num_tokens, chunk):
        indices = [piece.item_index for piece in slices_for_chunk(items, start, end)]
        assert indices == sorted(indices)


def test_docstring_example():
    items = [image(5, 16)]
    got = [
        [
            (s.row_start, s.row_end, s.position_start, s.position_end)
            for s in slices_for_chunk(items, start, end)
        ]
        for start, end in chunk_bounds(21, 8)
    ]
    assert got == [[(0, 3, 5, 8)], [(3, 11, 8, 16)], [(11, 16, 16, 21)]]


def test_chunk_that_touches_no_item_gets_no_slices():
    items = [image(4, 4)]
    assert slices_for_chunk(items, 0, 4) == []
    assert slices_for_chunk(items, 8, 12) == []


def test_chunk_splitting_two_items():
    items = [image(2, 3, "a" * 64), image(6, 4, "b" * 64)]
    assert slices_for_chunk(items, 3, 8) == [
        ChunkSlice(0, "a" * 64, 2, row_start=1, row_end=3),
        ChunkSlice(1, "b" * 64, 6, row_start=0, row_end=2),
    ]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((0, 5), (5, 10), None),  # touching: half-open, nothing shared
        ((5, 10), (0, 5), None),
        ((0, 5), (4, 10), (4, 5)),
        ((0, 10), (3, 4), (3, 4)),  # containment
        ((3, 3), (0, 10), None),  # empty range
        ((0, 3), (7, 9), None),  # apart
        ((2, 8), (2, 8), (2, 8)),
    ],
)
def test_overlap(a, b, expected):
    assert overlap(*a, *b) == expected


def test_chunk_bounds_from_a_start():
    assert list(chunk_bounds(10, 4, start=3)) == [(3, 7), (7, 10)]
    assert list(chunk_bounds(10, 4, start=10)) == []


@pytest.mark.parametrize("size", [0, -1])
def test_chunk_bounds_rejects_chunk_size_below_one(size):
    with pytest.raises(ValueError, match="max_chunk_tokens must be >= 1"):
        list(chunk_bounds(10, size))


# --- validate_ranges -------------------------------------------------------------------


def prompt_with_images(num_tokens: int, *spans: tuple[int, int]) -> list[int]:
    ids = [TEXT] * num_tokens
    for offset, length in spans:
        ids[offset : offset + length] = [IMAGE_ID] * length
    return ids


def test_valid_ranges_pass():
    ids = prompt_with_images(12, (1, 3), (6, 4))
    validate_ranges([image(1, 3), image(6, 4)], ids, IMAGE_ONLY)
    validate_ranges([], [TEXT] * 5, IMAGE_ONLY)


def test_unsorted_items_rejected():
    ids = prompt_with_images(12, (1, 3), (6, 4))
    with pytest.raises(ValueError, match=r"item 1: .*sorted and disjoint"):
        validate_ranges([image(6, 4), image(1, 3)], ids, IMAGE_ONLY)


def test_overlapping_items_rejected():
    ids = prompt_with_images(12, (1, 6))
    with pytest.raises(ValueError, match="item 1: offset 3 overlaps"):
        validate_ranges([image(1, 3), image(3, 4)], ids, IMAGE_ONLY)


def test_range_past_prompt_end_rejected():
    ids = prompt_with_images(8, (5, 3))
    with pytest.raises(ValueError, match=r"item 0: range \[5, 9\) runs past the prompt \(8"):
        validate_ranges([image(5, 4)], ids, IMAGE_ONLY)


def test_range_over_ordinary_text_rejected():
    ids = prompt_with_images(10, (2, 3))
    with pytest.raises(ValueError, match=f"position 5 holds token {TEXT}, not the image"):
        validate_ranges([image(2, 4)], ids, IMAGE_ONLY)


def test_placeholder_without_item_rejected():
    ids = prompt_with_images(12, (1, 3), (6, 4))
    with pytest.raises(ValueError, match="7 placeholder tokens but the items cover 3"):
        validate_ranges([image(1, 3)], ids, IMAGE_ONLY)


def test_modality_the_model_does_not_take_rejected():
    ids = [AUDIO_ID] * 4
    audio = PlaceholderRange(Modality.AUDIO, HASH, 0, 4)
    with pytest.raises(ValueError, match="item 0: this model takes no audio input"):
        validate_ranges([audio], ids, IMAGE_ONLY)


@pytest.mark.parametrize("length", [0, -2])
def test_empty_item_rejected(length):
    ids = prompt_with_images(6, (2, 2))
    with pytest.raises(ValueError, match="length must be >= 1"):
        validate_ranges([image(2, length)], ids, IMAGE_ONLY)


def test_two_modalities_each_on_its_own_placeholder():
    ids = [TEXT, IMAGE_ID, IMAGE_ID, TEXT, AUDIO_ID, AUDIO_ID, AUDIO_ID]
    both = {Modality.IMAGE: IMAGE_ID, Modality.AUDIO: AUDIO_ID}
    audio = PlaceholderRange(Modality.AUDIO, HASH, 4, 3)
    validate_ranges([image(1, 2), audio], ids, both)
    with pytest.raises(ValueError, match="not the audio placeholder"):
        validate_ranges([image(1, 2), PlaceholderRange(Modality.AUDIO, HASH, 3, 3)], ids, both)


@settings(deadline=None)  # no wall-clock limits on a busy 2-core machine
@given(prompts_with_items())
def test_generated_layouts_are_valid(case):
    num_tokens, items, _ = case
    ids = prompt_with_images(num_tokens, *[(item.offset, item.length) for item in items])
    validate_ranges(items, ids, IMAGE_ONLY)


# --- items that no chunk may cut ----------------------------------------------------------


def atomic_chunks(num_tokens: int, items: list[PlaceholderRange], chunk: int) -> list[tuple]:
    """Chunks as the decoder cuts them for a family whose items may not be split."""
    chunks, start = [], 0
    while start < num_tokens:
        end = atomic_chunk_end(items, start, min(start + chunk, num_tokens))
        chunks.append((start, end))
        start = end
    return chunks


def test_atomic_chunk_docstring_example():
    items = [image(4, 16), image(26, 4)]
    assert atomic_chunks(40, items, 8) == [(0, 4), (4, 20), (20, 26), (26, 34), (34, 40)]


@settings(max_examples=300, deadline=None)
@given(prompts_with_items())
def test_atomic_chunks_tile_the_prompt_and_never_cut_an_item(case):
    num_tokens, items, chunk = case
    chunks = atomic_chunks(num_tokens, items, chunk)
    assert [start for start, _ in chunks[1:]] == [end for _, end in chunks[:-1]]
    assert chunks[0][0] == 0 and chunks[-1][1] == num_tokens
    for start, end in chunks:
        assert start < end
        for item in items:
            assert not (start < item.offset < end < item.end), "the chunk cuts into an item"
            assert not (item.offset < start < item.end), "a chunk starts inside an item"
        # Only an item larger than the limit may stretch a chunk past it.
        if end - start > chunk:
            assert any(i.offset == start and i.end == end for i in items)


def test_atomic_block_floor():
    items = [image(10, 10), image(21, 19)]
    assert atomic_block_floor(items, 2, 16) == 0  # 32 cuts the second, 16 the first
    assert atomic_block_floor(items, 3, 16) == 3  # 48 is past both
    assert atomic_block_floor([image(16, 8)], 1, 16) == 1  # 16 is the item's start
    assert atomic_block_floor([], 5, 16) == 5
