"""The paged attention's mask for a segment equals the rows of the model's own mask over
the whole sequence (transformers' mask functions: causal, OR same image block, AND the
sliding window), for segments that start anywhere."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.masking_utils import (
    and_masks,
    blockwise_overlay,
    causal_mask_function,
    or_masks,
    sliding_window_overlay,
)

from decoder_service.paged_attention import Segment, _mask

NUM_TOKENS = 24
ITEMS = ((3, 9), (12, 14), (20, 23))


def model_mask(sliding_window: int | None, items: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """[NUM_TOKENS, NUM_TOKENS] from transformers' own mask functions."""
    groups = torch.full((1, NUM_TOKENS), -1)
    for index, (start, end) in enumerate(items):
        groups[0, start:end] = index
    function = or_masks(causal_mask_function, blockwise_overlay(groups))
    if sliding_window is not None:
        function = and_masks(function, sliding_window_overlay(sliding_window))
    queries = torch.arange(NUM_TOKENS).unsqueeze(1)
    keys = torch.arange(NUM_TOKENS).unsqueeze(0)
    return function(torch.tensor(0), torch.tensor(0), queries, keys).expand(NUM_TOKENS, NUM_TOKENS)


@pytest.mark.parametrize("sliding_window", [None, 4, 7, 100])
@pytest.mark.parametrize("items", [(), ITEMS])
def test_segment_masks_are_rows_of_the_whole(sliding_window, items):
    whole = model_mask(sliding_window, items)
    for start, end in itertools.combinations(range(NUM_TOKENS + 1), 2):
        inside = tuple(i for i in items if i[0] < end and start < i[1])
        segment = Segment(0, end - start, start, tuple(range(end)), inside)
        mask = _mask(segment, end - start, sliding_window, torch.device("cpu"))
        expected = whole[start:end, :end]
        if mask is None:  # plain causal: SDPA's is_causal, or one query seeing everything
            assert torch.equal(expected, torch.ones_like(expected).tril(start)), (start, end)
        else:
            assert torch.equal(mask, expected), (start, end)
