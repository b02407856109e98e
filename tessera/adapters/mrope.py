"""Multimodal RoPE positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) for any slice of a
sequence, from the items' ranges and layouts alone.

The model's own `get_rope_index` walks the whole prompt: text tokens count up on all
three axes; a range of merged grid (t, h, w) starting where the text left off at `p`
gives its row r the positions

    (p + floor((r // (h * w)) * interval),  p + (r // w) % h,  p + r % w)

and the text after it resumes at `p + max(h, w)`. `interval` is 1, except for Qwen2.5-VL
videos: `tokens_per_second * second_per_grid_t`, so a row's temporal position tells the
time it shows. So every range shifts what follows by `max(h, w) - rows`, and a token's
positions depend only on the ranges before it: a chunk `[start, end)` is computed
directly, and equals the slice of the whole prompt's positions for every chunk boundary,
including one that cuts an item. (A Qwen3-VL video is one range per frame, each of grid
(1, h, w) as the model splits it.) Generated tokens continue the text: index `i` gets
`i + shift`, where `shift` sums every range's shift, as `generate()` does (it counts on
from the prompt's last position). The model's `rope_deltas` (and vLLM) count on from the
prompt's largest position instead, which is the same for images but not where a Qwen2.5-VL
video's spaced time positions pass the text after it; `generate()` is the oracle here.

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

from tessera.placeholders import ItemLayout, Modality, PlaceholderRange


def mrope_positions(
    ranges: Sequence[PlaceholderRange],
    start: int,
    end: int,
    tokens_per_second: float = 1.0,
    device: torch.device | None = None,
) -> torch.Tensor:
    """`[3, end - start]` positions of sequence indices `[start, end)`; `ranges` sorted."""
    out = torch.empty(3, end - start, dtype=torch.long, device=device)
    shift = 0  # position minus index, for text after the ranges seen so far
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
            interval = _time_interval(item.layout, tokens_per_second)
            rows = torch.arange(first - item.offset, last - item.offset, device=device)
            out[:, first - start : last - start] = _item_rows(item, rows, shift, interval)
            cursor = last
        shift += item_shift(item.layout, item.length)
    if cursor < end:
        out[:, cursor - start :] = _text(cursor, end, shift, device)
    return out


def item_shift(layout: ItemLayout, num_rows: int) -> int:
    """How far a range moves the positions of everything after it."""
    _, height, width = layout.merged_grid
    return max(height, width) - num_rows


def check_grid_layout(
    item: PlaceholderRange, merge_size: int, num_planes: int, range_per_frame: bool = False
) -> None:
    """Raises ValueError unless the item's grid fits its range and the model. An image's
    grid is (1, h, w); a video's (t, h, w), one range for all its rows, or with
    `range_per_frame` (Qwen3-VL) one range per temporal step."""
    layout = item.layout
    where = f"item at offset {item.offset}"
    if len(layout.grid_thw) != 3:
        raise ValueError(f"{where}: the layout needs grid_thw = (t, h, w), got {layout.grid_thw}")
    if layout.spatial_merge_size != merge_size:
        raise ValueError(
            f"{where}: spatial_merge_size {layout.spatial_merge_size} != the model's {merge_size}"
        )
    t, h, w = layout.grid_thw
    if h % merge_size or w % merge_size or (t != 1 and item.modality != Modality.VIDEO):
        raise ValueError(
            f"{where}: an image grid is (1, h, w) (a video's (t, h, w)) with h and w "
            f"multiples of {merge_size}, got {layout.grid_thw}"
        )
    if layout.second_per_grid_t and item.modality != Modality.VIDEO:
        raise ValueError(f"{where}: only a video's layout has second_per_grid_t")
    _, merged_h, merged_w = layout.merged_grid
    rows_per_range = merged_h * merged_w if range_per_frame else layout.num_grid_rows
    if item.length != rows_per_range or item.row_start % rows_per_range:
        raise ValueError(
            f"{where}: grid {layout.grid_thw} with merge {merge_size} gives ranges of "
            f"{rows_per_range} rows, but this range holds rows [{item.row_start}, "
            f"{item.row_start + item.length})"
        )
    if item.row_start + item.length > layout.num_grid_rows:
        raise ValueError(
            f"{where}: rows [{item.row_start}, {item.row_start + item.length}) run past the "
            f"item's {layout.num_grid_rows} rows"
        )
    if layout.num_planes != num_planes:
        raise ValueError(
            f"{where}: {layout.num_planes} plane(s), but this model's items have {num_planes}"
        )


def _time_interval(layout: ItemLayout, tokens_per_second: float) -> torch.Tensor | int:
    """How far apart a range's temporal steps are, computed as the model does (float32)."""
    if not layout.second_per_grid_t:
        return 1
    return torch.tensor(layout.second_per_grid_t, dtype=torch.float32) * tokens_per_second


def _text(first: int, last: int, shift: int, device: torch.device | None) -> torch.Tensor:
    return (torch.arange(first, last, device=device) + shift).expand(3, -1)


def _item_rows(
    item: PlaceholderRange, rows: torch.Tensor, shift: int, interval: torch.Tensor | int
) -> torch.Tensor:
    _, height, width = item.layout.merged_grid
    base = item.offset + shift
    steps = rows // (height * width)
    temporal = (steps * interval).long() if isinstance(interval, torch.Tensor) else steps
    return torch.stack([base + temporal, base + (rows // width) % height, base + rows % width])
