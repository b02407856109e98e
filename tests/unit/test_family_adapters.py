"""Every family's adapter, on its demo checkpoint: the rows the front door promises are
the rows the encoder makes, whatever else is in the batch; layouts the decoder is sent
are checked against them; options a family does not take are refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tessera.adapters import LoadOptions, MediaInput, ModelPart, load_family
from tessera.demo_models import DEMO_FAMILIES, make_demo_model
from tessera.media import ProcessingOptions
from tessera.media_decoder import MediaDecoder, MediaLimits
from tessera.placeholders import Modality, PlaceholderRange
from tessera.testbed.audio_files import wav_clip
from tessera.testbed.reference import noise_image

IMAGES = [noise_image(21, 60, 45), noise_image(22, 130, 40), noise_image(23, 30, 90)]
CLIPS = [wav_clip(21, 1.5).data, wav_clip(22, 0.4, 44_100, 2).data, wav_clip(23, 3.0).data]


def items_of(family, options: ProcessingOptions, count: int = 3) -> list[MediaInput]:
    """`count` items of the family's modality, of different sizes."""
    # The family's one still-media modality: audio families take audio, the rest images
    # (Qwen-VL's videos have tests of their own, tests/service/test_video.py).
    modality = Modality.AUDIO if Modality.AUDIO in family.modalities else Modality.IMAGE
    decoder = MediaDecoder.for_family(family, MediaLimits())
    data = CLIPS if modality == Modality.AUDIO else IMAGES
    return [MediaInput(decoder.decode(modality, d), options) for d in data[:count]]


@pytest.fixture(scope="module", params=list(DEMO_FAMILIES))
def family(request, tmp_path_factory):
    model_dir = make_demo_model(tmp_path_factory.mktemp(request.param), family=request.param)
    parts = ModelPart.PROCESSOR | ModelPart.MEDIA_ENCODER
    return load_family(str(model_dir), LoadOptions(parts))


@pytest.mark.parametrize("num_items", [1, 3])
def test_rows_are_what_the_placement_promised_alone_and_batched(family, num_items):
    options = family.processing_options({}, num_items)
    items = items_of(family, options)
    together = family.encode(items)
    width = family.hidden_size * family.num_planes
    for item, rows in zip(items, together, strict=True):
        placement = family.item_placement(item)
        assert rows.shape == (placement.num_rows, width)
        assert placement.layout.num_planes == family.num_planes
        alone = family.encode([item])[0]
        torch.testing.assert_close(alone, rows, atol=1e-5, rtol=1e-5)
        family.check_layout(
            PlaceholderRange(item.modality, "0" * 64, 0, placement.num_rows, placement.layout)
        )


def test_a_layout_that_does_not_fit_is_refused(family):
    options = family.processing_options({}, 1)
    placement = family.item_placement(items_of(family, options, 1)[0])
    layout = placement.layout
    t, h, w = layout.grid_thw or (1, 2, 2)
    wrong = {
        "planes": replace(layout, num_planes=layout.num_planes + 1),
        "merge": replace(layout, spatial_merge_size=layout.spatial_merge_size + 1),
        # Qwen-VL: a grid of other rows than the length; others: any grid at all.
        "grid": replace(layout, grid_thw=(t, h, w + 2 * layout.spatial_merge_size)),
    }
    for name, bad in wrong.items():
        item = PlaceholderRange(Modality.IMAGE, "0" * 64, 0, placement.num_rows, bad)
        with pytest.raises(ValueError, match="item at offset 0"):
            family.check_layout(item)
            pytest.fail(f"a wrong {name} was accepted")


def test_unknown_processing_options_are_refused(family):
    with pytest.raises(ValueError, match="no_such_option"):
        family.processing_options({"no_such_option": 1}, 1)
    with pytest.raises(ValueError):
        family.check_options(ProcessingOptions.of({"no_such_option": 1}))
