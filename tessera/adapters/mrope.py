"""Multimodal RoPE positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) for any slice of a
sequence, from the items' ranges and layouts alone.

The model's own `get_rope_index` walks the whole prompt: text tokens count up on all
three axes; an item with merged grid (t, h, w) starting where the text left off at `p`
gives its row r the positions

    (p + r // (h * w),  p + (r // w) % h,  p + r % w)

and the text after it resumes at `p + max(h, w)`. So every item shifts what follows by
`max(h, w) - rows`, and a token's positions depend only on the items before it: a chunk
`[start, end)` is computed directly, and equals the slice of the whole prompt's positions
for every chunk boundary, including one that cuts an item. Generated tokens continue
the text: position `index + shift`, where `shift` sums every item's shift (the model's
`rope_deltas`).

Example: text of 3 tokens, an image of grid (1, 2, 3) (6 rows), then 2 tokens:

    index      0  1  2 | 3  4  5  6  7  8 | 9  10
    temporal   0  1  2 | 3  3  3  3  3  3 | 6  7
    height     0  1  2 | 3  3  3  4  4  4 | 6  7
    width      0  1  2 | 3  4  5  3  4  5 | 6  7

(the image shifts what follows by max(2, 3) - 6 = -3: index 9 -> position 6).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tessera.placeholders import ItemLayout, PlaceholderRange


def mrope_positions(
    ranges: Sequence[PlaceholderRange], start: int, end: int, device: torch.device | None = None
) -> torch.Tensor:
    """`[3, end - start]` positions of sequence indices `[start, end)`; `ranges` sorted."""
    out = torch.empty(3, end - start, dtype=torch.long, device=device)
    shift = 0  # position minus index, for text after the items seen so far
    cursor = start
    for item in ranges:
        if item.offset >= end:
            break
        text_end = min(item.offset, end)
        if cursor < text_end:
            out[:, cursor - start : text_end - start] = _text(cursor, text_end, shift, device)
            cursor = text_end
        first, last = max(cursor, item.offset), min(end, item.end)
        if first < last:
            rows = torch.arange(first - item.offset, last - item.offset, device=device)
            out[:, first - start : last - start] = _item_rows(item, rows, shift)
            cursor = last
        shift += item_shift(item.layout, item.length)
    if cursor < end:
        out[:, cursor - start :] = _text(cursor, end, shift, device)
    return out


def item_shift(layout: ItemLayout, num_rows: int) -> int:
    """How far an item moves the positions of everything after it."""
    _, height, width = layout.merged_grid
    return max(height, width) - num_rows


def check_grid_layout(item: PlaceholderRange, merge_size: int, num_planes: int) -> None:
    """Raises ValueError unless the item's grid fits its length and the model."""
    layout = item.layout
    where = f"item at offset {item.offset}"
    if len(layout.grid_thw) != 3:
        raise ValueError(f"{where}: the layout needs grid_thw = (t, h, w), got {layout.grid_thw}")
    if layout.spatial_merge_size != merge_size:
        raise ValueError(
            f"{where}: spatial_merge_size {layout.spatial_merge_size} != the model's {merge_size}"
        )
    t, h, w = layout.grid_thw
    if t != 1 or h % merge_size or w % merge_size:
        raise ValueError(
            f"{where}: an image grid is (1, h, w) with h and w multiples of {merge_size}, "
            f"got {layout.grid_thw}"
        )
    if layout.num_grid_rows != item.length:
        raise ValueError(
            f"{where}: grid {layout.grid_thw} with merge {merge_size} gives "
            f"{layout.num_grid_rows} rows, but the item's length is {item.length}"
        )
    if layout.num_planes != num_planes:
        raise ValueError(
            f"{where}: {layout.num_planes} plane(s), but this model's items have {num_planes}"
        )


def _text(first: int, last: int, shift: int, device: torch.device | None) -> torch.Tensor:
    return (torch.arange(first, last, device=device) + shift).expand(3, -1)


def _item_rows(item: PlaceholderRange, rows: torch.Tensor, shift: int) -> torch.Tensor:
    _, height, width = item.layout.merged_grid
    base = item.offset + shift
    return torch.stack(
        [base + rows // (height * width), base + (rows // width) % height, base + rows % width]
    )
