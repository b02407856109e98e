"""M-RoPE positions for any chunk equal the slice of the whole prompt's positions that the
model's own `get_rope_index` gives (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), for every chunk
boundary including ones that cut an image, and generated tokens continue with the
model's `rope_deltas`."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from tessera.adapters.mrope import check_grid_layout, mrope_positions
from tessera.placeholders import ItemLayout, Modality, PlaceholderRange

IMAGE_TOKEN = 7
MERGE = 2
HASH = "0" * 64

CONFIGS = {
    "qwen2-vl": ("Qwen2VLConfig", "Qwen2VLModel"),
    "qwen2.5-vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLModel"),
    "qwen3-vl": ("Qwen3VLConfig", "Qwen3VLModel"),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def rope_index(request):
    """The model's own get_rope_index, on a model too small to matter."""
    config_name, model_name = CONFIGS[request.param]
    config = getattr(transformers, config_name)(
        text_config={
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "intermediate_size": 16,
            "vocab_size": 32,
            "head_dim": 8,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1]},
        },
        # One superset of the three vision configs' size keys, all tiny.
        vision_config={
            "depth": 1,
            "spatial_merge_size": MERGE,
            "embed_dim": 16,
            "hidden_size": 16,
            "out_hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "num_position_embeddings": 16,
        },
        image_token_id=IMAGE_TOKEN,
    )
    model = getattr(transformers, model_name)(config)
    return model.get_rope_index


def build(segments: list[int | tuple[int, int]]) -> tuple[list[int], list[PlaceholderRange]]:
    """Token ids and ranges from text lengths and image grids (h, w) in patches."""
    token_ids: list[int] = []
    ranges = []
    for segment in segments:
        if isinstance(segment, int):
            token_ids += [1] * segment
            continue
        layout = ItemLayout((1, *segment), MERGE)
        ranges.append(
            PlaceholderRange(Modality.IMAGE, HASH, len(token_ids), layout.num_grid_rows, layout)
        )
        token_ids += [IMAGE_TOKEN] * layout.num_grid_rows
    return token_ids, ranges


def reference(rope_index, token_ids, ranges):
    ids = torch.tensor([token_ids])
    positions, delta = rope_index(
        ids,
        mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
        image_grid_thw=torch.tensor([r.layout.grid_thw for r in ranges]) if ranges else None,
    )
    return positions[:, 0], int(delta)


PROMPTS = [
    [3, (4, 6), 2],
    [(2, 2), 5],
    [4, (8, 4), 1, (2, 6), 3],
    [1, (6, 2), 2, (4, 4), 1, (2, 2), 6],
]


@pytest.mark.parametrize("segments", PROMPTS)
def test_every_chunk_is_the_slice_of_the_whole(rope_index, segments):
    token_ids, ranges = build(segments)
    whole, delta = reference(rope_index, token_ids, ranges)
    assert torch.equal(mrope_positions(ranges, 0, len(token_ids)), whole)
    for chunk in range(1, len(token_ids) + 1):
        for start in range(0, len(token_ids), chunk):
            end = min(start + chunk, len(token_ids))
            assert torch.equal(mrope_positions(ranges, start, end), whole[:, start:end]), (
                chunk,
                start,
            )
    # Generated tokens: index + the model's rope delta, on all three axes.
    generated = mrope_positions(ranges, len(token_ids), len(token_ids) + 4)
    expected = torch.arange(len(token_ids), len(token_ids) + 4) + delta
    assert torch.equal(generated, expected.expand(3, -1))


def test_random_layouts_match(rope_index):
    rng = random.Random(5)
    for _ in range(25):
        segments: list[int | tuple[int, int]] = []
        for _ in range(rng.randint(1, 4)):
            # Text between images: the chat templates always separate them (and the
            # model's own get_rope_index would take two adjacent images for one).
            segments.append(rng.randint(1, 4))
            segments.append((2 * rng.randint(1, 4), 2 * rng.randint(1, 4)))
        segments.append(rng.randint(0, 3) or 1)
        token_ids, ranges = build(segments)
        whole, _ = reference(rope_index, token_ids, ranges)
        start = rng.randrange(len(token_ids))
        end = rng.randint(start + 1, len(token_ids))
        assert torch.equal(mrope_positions(ranges, start, end), whole[:, start:end])


def test_the_example_in_the_docstring():
    _, ranges = build([3, (4, 6), 2])  # merged grid (1, 2, 3): 6 rows
    positions = mrope_positions(ranges, 0, 11)
    assert positions.tolist() == [
        [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
        [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
        [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
    ]


@pytest.mark.parametrize(
    ("grid", "length", "planes", "message"),
    [
        ((1, 4, 4), 5, 1, "gives 4 rows"),
        ((1, 4), 4, 1, "grid_thw"),
        ((2, 4, 4), 8, 1, r"an image grid is \(1, h, w\)"),
        ((1, 3, 4), 3, 1, "multiples of 2"),
        ((1, 4, 4), 4, 2, "plane"),
    ],
)
def test_bad_layouts_are_refused(grid, length, planes, message):
    item = PlaceholderRange(Modality.IMAGE, HASH, 0, length, ItemLayout(grid, MERGE, planes))
    with pytest.raises(ValueError, match=message):
        check_grid_layout(item, MERGE, num_planes=1)
