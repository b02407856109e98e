"""M-RoPE positions for any chunk equal the slice of the whole prompt's positions that the
model's own `get_rope_index` gives (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), for every chunk
boundary including ones that cut an image or a video, and generated tokens count on from
the prompt's last position, as `generate()` does."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from tessera.adapters.mrope import check_grid_layout, mrope_positions
from tessera.placeholders import ItemLayout, Modality, PlaceholderRange

IMAGE_TOKEN = 7
VIDEO_TOKEN = 8
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
        video_token_id=VIDEO_TOKEN,
    )
    model = getattr(transformers, model_name)(config)
    return RopeIndex(request.param, model.get_rope_index, config.vision_config)


class RopeIndex:
    """A family's get_rope_index and how it lays out videos."""

    def __init__(self, name: str, function, vision_config):
        self.name = name
        self.function = function
        self.tokens_per_second = getattr(vision_config, "tokens_per_second", None)
        self.range_per_frame = name == "qwen3-vl"  # timestamps between a video's frames

    def positions(self, ranges, start: int, end: int) -> torch.Tensor:
        return mrope_positions(ranges, start, end, self.tokens_per_second or 1)


# A prompt: text lengths, image grids (h, w) in patches, and videos Video(t, h, w, spacing).
class Video:
    def __init__(self, t: int, h: int, w: int, second_per_grid_t: float = 0.0):
        self.grid = (t, h, w)
        self.second_per_grid_t = second_per_grid_t


def build(segments: list, rope=None) -> tuple[list[int], list[PlaceholderRange]]:
    """Token ids and ranges: a video is one range, or with Qwen3-VL one per temporal step
    after two timestamp tokens; its spacing only where the family spaces time."""
    token_ids: list[int] = []
    ranges = []
    for segment in segments:
        if isinstance(segment, int):
            token_ids += [1] * segment
            continue
        if isinstance(segment, Video):
            spacing = segment.second_per_grid_t if rope and rope.tokens_per_second else 0.0
            layout = ItemLayout(segment.grid, MERGE, second_per_grid_t=spacing)
            num_ranges = segment.grid[0] if rope and rope.range_per_frame else 1
            length = layout.num_grid_rows // num_ranges
            for index in range(num_ranges):
                if num_ranges > 1:
                    token_ids += [2, 3]  # "<1.0 seconds>"
                ranges.append(
                    PlaceholderRange(
                        Modality.VIDEO, HASH, len(token_ids), length, layout, index * length
                    )
                )
                token_ids += [VIDEO_TOKEN] * length
            continue
        layout = ItemLayout((1, *segment), MERGE)
        ranges.append(
            PlaceholderRange(Modality.IMAGE, HASH, len(token_ids), layout.num_grid_rows, layout)
        )
        token_ids += [IMAGE_TOKEN] * layout.num_grid_rows
    return token_ids, ranges


def reference(rope, token_ids, ranges):
    ids = torch.tensor([token_ids])
    images = [r for r in ranges if r.modality == Modality.IMAGE]
    videos = [r for r in ranges if r.modality == Modality.VIDEO and r.row_start == 0]
    kwargs = {}
    if videos and rope.tokens_per_second:
        kwargs["second_per_grid_ts"] = torch.tensor(
            [r.layout.second_per_grid_t for r in videos], dtype=torch.float32
        )
    positions, delta = rope.function(
        ids,
        mm_token_type_ids=(ids == IMAGE_TOKEN).int() + 2 * (ids == VIDEO_TOKEN).int(),
        image_grid_thw=torch.tensor([r.layout.grid_thw for r in images]) if images else None,
        video_grid_thw=torch.tensor([r.layout.grid_thw for r in videos]) if videos else None,
        **kwargs,
    )
    return positions[:, 0], int(delta)


PROMPTS = [
    [3, (4, 6), 2],
    [(2, 2), 5],
    [4, (8, 4), 1, (2, 6), 3],
    [1, (6, 2), 2, (4, 4), 1, (2, 2), 6],
    # Videos: spaced so their time positions pass the text after them (and not), an
    # uneven spacing that float32 rounds, a video beside images.
    [3, Video(4, 4, 4, 2.0), 2],
    [2, Video(6, 2, 4, 0.5), 3],
    [1, Video(3, 4, 2, 1 / 3), 2, (4, 4), 2],
    [2, (2, 4), 1, Video(5, 2, 2, 7.0), 1, Video(2, 6, 4, 1.0), 4],
]


@pytest.mark.parametrize("segments", PROMPTS)
def test_every_chunk_is_the_slice_of_the_whole(rope_index, segments):
    token_ids, ranges = build(segments, rope_index)
    whole, delta = reference(rope_index, token_ids, ranges)
    num_tokens = len(token_ids)
    assert torch.equal(rope_index.positions(ranges, 0, num_tokens), whole)
    for chunk in range(1, num_tokens + 1):
        for start in range(0, num_tokens, chunk):
            end = min(start + chunk, num_tokens)
            got = rope_index.positions(ranges, start, end)
            assert torch.equal(got, whole[:, start:end]), (chunk, start)
    # Generated tokens, on all three axes: on from the prompt's last position, as
    # generate() counts (its _update_model_kwargs_for_generation: last + 1); that is the
    # model's rope delta unless a video's time positions pass the text after it.
    generated = rope_index.positions(ranges, num_tokens, num_tokens + 4)
    expected = torch.arange(1, 5) + whole[0, -1]
    assert torch.equal(generated, expected.expand(3, -1))
    if all(r.modality == Modality.IMAGE for r in ranges):
        assert torch.equal(expected, torch.arange(num_tokens, num_tokens + 4) + delta)


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
        got = rope_index.positions(ranges, start, end)
        assert torch.equal(got, whole[:, start:end])


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
        ((1, 4, 4), 5, 1, "gives ranges of 4 rows"),
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


@pytest.mark.parametrize(
    ("grid", "length", "row_start", "per_frame", "spacing", "message"),
    [
        ((3, 4, 4), 12, 0, False, 1.0, None),  # a whole video
        ((3, 4, 4), 4, 4, True, 0.0, None),  # Qwen3-VL: its second frame
        ((3, 4, 4), 4, 0, False, 0.0, "gives ranges of 12 rows"),
        ((3, 4, 4), 4, 2, True, 0.0, r"holds rows \[2, 6\)"),
        ((3, 4, 4), 4, 12, True, 0.0, "run past the item's 12 rows"),
    ],
)
def test_video_layouts(grid, length, row_start, per_frame, spacing, message):
    layout = ItemLayout(grid, MERGE, second_per_grid_t=spacing)
    item = PlaceholderRange(Modality.VIDEO, HASH, 0, length, layout, row_start)
    if message is None:
        check_grid_layout(item, MERGE, num_planes=1, range_per_frame=per_frame)
        return
    with pytest.raises(ValueError, match=message):
        check_grid_layout(item, MERGE, num_planes=1, range_per_frame=per_frame)


def test_only_videos_have_time_spacing():
    layout = ItemLayout((1, 4, 4), MERGE, second_per_grid_t=1.0)
    item = PlaceholderRange(Modality.IMAGE, HASH, 0, 4, layout)
    with pytest.raises(ValueError, match="only a video's layout"):
        check_grid_layout(item, MERGE, num_planes=1)


def test_spaced_video_positions_pass_the_text_after_it():
    """4 steps 2 s apart at 2 tokens per second put the last step at +12, past the 2
    text tokens after a 2 x 2 grid (+2, +3); generated tokens still continue the text,
    as generate() does (the model's rope delta would start them at 14)."""
    layout = ItemLayout((4, 4, 4), MERGE, second_per_grid_t=2.0)
    ranges = [PlaceholderRange(Modality.VIDEO, HASH, 1, 16, layout)]
    positions = mrope_positions(ranges, 0, 20, tokens_per_second=2)
    assert positions[0, 1:17].tolist() == [1] * 4 + [5] * 4 + [9] * 4 + [13] * 4
    assert positions[:, 17].tolist() == [3, 3, 3]  # text resumes at 1 + max(h, w)
    assert positions[:, 19].tolist() == [5, 5, 5]  # generated: on from the last
