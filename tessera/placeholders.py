"""Placeholder ranges and the one place where chunk/item overlap math lives.

A media item occupies prompt positions `[offset, offset + length)`; row `r` of its
embedding goes to position `offset + r`. A prefill chunk `[start, end)` needs exactly the
rows of each item that fall inside the chunk:

    rows [max(start, offset) - offset, min(end, offset + length) - offset)

Example: an item at offset 5 with 16 rows, prompt chunked by 8:

    chunk [0, 8)   -> rows [0, 3)   at positions [5, 8)
    chunk [8, 16)  -> rows [3, 11)  at positions [8, 16)
    chunk [16, 24) -> rows [11, 16) at positions [16, 21)

Every row is fetched once in total, and none outside its chunk.

Some families attend bidirectionally inside an item (Gemma 3): a chunk must then never cut
an item, and `atomic_chunk_end` moves a chunk's end to an item boundary.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum


class Modality(str, Enum):
    IMAGE = "image"
    AUDIO = "audio"
    VIDEO = "video"


@dataclass(frozen=True)
class ItemLayout:
    """How an item's rows are arranged, as its model family defines them; travels with
    the item's range so the decoder can compute positions and check the row count.

    `grid_thw` is the item's patch grid before merging (Qwen-VL: temporal, height,
    width), empty for families whose rows are a plain sequence; `spatial_merge_size`
    patches per side become one row, so rows = t * h * w / merge^2. `num_planes` is how
    many planes of the same rows the item has (Qwen3-VL deepstack: 1 + levels); they
    travel side by side in each row, `num_planes * hidden_size` values wide.

    Example: a Qwen2-VL image of 224 x 168 px (patch 14, merge 2) has the grid (1, 16, 12)
    and 1 * 16 * 12 / 4 = 48 rows, laid out as 8 rows of 6 merged patches.
    """

    grid_thw: tuple[int, ...] = ()
    spatial_merge_size: int = 1
    num_planes: int = 1
    # Qwen2.5-VL videos: seconds of video per temporal grid step (the processor's
    # `second_per_grid_ts`), which spaces the rows' temporal positions; 0: no spacing.
    second_per_grid_t: float = 0.0

    @property
    def merged_grid(self) -> tuple[int, int, int]:
        """(t, h, w) in rows: the grid after merging."""
        t, h, w = self.grid_thw
        merge = self.spatial_merge_size
        return t, h // merge, w // merge

    @property
    def num_grid_rows(self) -> int:
        t, h, w = self.merged_grid
        return t * h * w


@dataclass(frozen=True)
class PlaceholderRange:
    """An item's placeholder positions `[offset, offset + length)` in a prompt, holding
    the item's rows `[row_start, row_start + length)`.

    Most items are one range (`row_start` 0, all rows). An item whose processor puts text
    between its rows is several ranges of one content hash: a Qwen3-VL video writes a
    timestamp before each frame's rows, so a video of 3 frames of 4 rows is the ranges
    (row_start 0, length 4), (4, 4) and (8, 4), each after its timestamp's tokens.
    """

    modality: Modality
    content_hash: str
    offset: int
    length: int
    layout: ItemLayout = ItemLayout()
    row_start: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def num_item_rows(self) -> int:
        """Rows of the whole item (not only this range's): its grid's, when it has one."""
        return self.layout.num_grid_rows if self.layout.grid_thw else self.row_start + self.length


@dataclass(frozen=True)
class ChunkSlice:
    """Rows `[row_start, row_end)` of item `item_index`, placed at positions
    `[row_start + offset, row_end + offset)` of the prompt (`offset`: where the item's
    row 0 would sit, its range's offset minus its row_start)."""

    item_index: int
    content_hash: str
    offset: int
    row_start: int
    row_end: int

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start

    @property
    def position_start(self) -> int:
        return self.offset + self.row_start

    @property
    def position_end(self) -> int:
        return self.offset + self.row_end


def overlap(start_a: int, end_a: int, start_b: int, end_b: int) -> tuple[int, int] | None:
    """The intersection of `[start_a, end_a)` and `[start_b, end_b)`, or None if empty."""
    start, end = max(start_a, start_b), min(end_a, end_b)
    return (start, end) if start < end else None


def slices_for_chunk(ranges: Sequence[PlaceholderRange], start: int, end: int) -> list[ChunkSlice]:
    """The rows each item contributes to the chunk `[start, end)`, in prompt order."""
    slices = []
    for index, item in enumerate(ranges):
        hit = overlap(start, end, item.offset, item.end)
        if hit is not None:
            slices.append(
                ChunkSlice(
                    item_index=index,
                    content_hash=item.content_hash,
                    offset=item.offset - item.row_start,
                    row_start=hit[0] - item.offset + item.row_start,
                    row_end=hit[1] - item.offset + item.row_start,
                )
            )
    return slices


def chunk_bounds(
    num_tokens: int, max_chunk_tokens: int, start: int = 0
) -> Iterator[tuple[int, int]]:
    """Splits `[start, num_tokens)` into consecutive chunks of at most `max_chunk_tokens`."""
    if max_chunk_tokens < 1:
        raise ValueError(f"max_chunk_tokens must be >= 1, got {max_chunk_tokens}")
    for chunk_start in range(start, num_tokens, max_chunk_tokens):
        yield chunk_start, min(chunk_start + max_chunk_tokens, num_tokens)


def atomic_chunk_end(ranges: Sequence[PlaceholderRange], start: int, end: int) -> int:
    """The end of chunk `[start, end)` moved so the chunk cuts no item: back to the start
    of the item it would cut, or, when that item starts at `start` (or before it), on
    to the item's end, so an item larger than the chunk limit gets a chunk of its own.

    Example: items at [4, 20) and [26, 30), chunk limit 8, a prompt of 40 tokens:

        [0, 4)   -> stops before the first item
        [4, 20)  -> the whole first item (16 > 8)
        [20, 26) -> stops before the second
        [26, 34) -> the second item and what follows
        [34, 40)
    """
    for item in ranges:
        if item.offset < end < item.end:
            return item.offset if item.offset > start else item.end
    return end


def atomic_block_floor(ranges: Sequence[PlaceholderRange], num_blocks: int, block_size: int) -> int:
    """The most of the first `num_blocks` blocks whose end cuts no item.

    Example: items at [10, 20) and [21, 40), blocks of 16: 2 blocks end at 32, inside the
    second item; 1 block ends at 16, inside the first; 0 blocks is the answer.
    """
    while num_blocks:
        end = num_blocks * block_size
        cut = next((item for item in ranges if item.offset < end < item.end), None)
        if cut is None:
            break
        num_blocks = cut.offset // block_size
    return num_blocks


def validate_ranges(
    ranges: Sequence[PlaceholderRange],
    prompt_token_ids: Sequence[int],
    placeholder_token_ids: dict[Modality, int],
) -> None:
    """Raises ValueError unless the ranges are sorted, disjoint, inside the prompt, and
    cover exactly the prompt's placeholder tokens (no placeholder without an item, no
    item over ordinary text)."""
    num_tokens = len(prompt_token_ids)
    previous_end = 0
    covered = 0
    for index, item in enumerate(ranges):
        if item.modality not in placeholder_token_ids:
            raise ValueError(f"item {index}: this model takes no {item.modality.value} input")
        if item.length < 1:
            raise ValueError(f"item {index}: length must be >= 1, got {item.length}")
        if item.offset < previous_end:
            raise ValueError(
                f"item {index}: offset {item.offset} overlaps or precedes the previous item "
                f"(which ends at {previous_end}); items must be sorted and disjoint"
            )
        if item.end > num_tokens:
            raise ValueError(
                f"item {index}: range [{item.offset}, {item.end}) runs past the prompt "
                f"({num_tokens} tokens)"
            )
        expected = placeholder_token_ids[item.modality]
        wrong = [p for p in range(item.offset, item.end) if prompt_token_ids[p] != expected]
        if wrong:
            raise ValueError(
                f"item {index}: position {wrong[0]} holds token {prompt_token_ids[wrong[0]]}, "
                f"not the {item.modality.value} placeholder {expected}"
            )
        previous_end = item.end
        covered += item.length
    placeholder_ids = set(placeholder_token_ids.values())
    num_placeholders = sum(1 for t in prompt_token_ids if t in placeholder_ids)
    if num_placeholders != covered:
        raise ValueError(
            f"the prompt has {num_placeholders} placeholder tokens but the items cover "
            f"{covered}; every placeholder needs an item and every item its placeholders"
        )
