"""The gateway's prompt builder: processing options from the server and the request
change an item's rows and its content hash; markers and placeholders must agree; the
expanded prompt's ids equal the family processor's own."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from gateway.config import GatewayConfig
from gateway.main import build_parser
from gateway.prompt import PromptBuilder, PromptError
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.demo_models import make_demo_model
from tessera.media_decoder import MediaLimits
from tessera.testbed.reference import Reference, noise_image, to_chat_inputs

IMAGE = noise_image(31, 130, 100)
PROMPT = [("user", [IMAGE, "What is it?"])]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    model_dir = make_demo_model(tmp_path_factory.mktemp("qwen") / "m", family="qwen2-vl")
    return model_dir, load_family(str(model_dir), LoadOptions(ModelPart.PROCESSOR))


def test_server_defaults_and_request_options_change_rows_and_hash(qwen):
    model_dir, family = qwen
    unit = 28 * 28  # patch 14, merge 2: the pixels of one row
    plain = PromptBuilder(family, MediaLimits(10**8), 4).build(to_chat_inputs(PROMPT))
    small = PromptBuilder(family, MediaLimits(10**8), 4, {"max_pixels": 6 * unit})
    by_server = small.build(to_chat_inputs(PROMPT))
    by_request = small.build(to_chat_inputs(PROMPT), {"max_pixels": 12 * unit})
    rows = [p.items[0].range.length for p in (plain, by_server, by_request)]
    assert rows[1] <= 6 < rows[2] <= 12 < rows[0]
    hashes = {p.items[0].range.content_hash for p in (plain, by_server, by_request)}
    assert len(hashes) == 3, "each setting is its own cache entry"
    assert by_request.items[0].options.as_dict() == {"max_pixels": 12 * unit}
    # The processor with the same setting makes the same ids.
    reference = Reference(model_dir)
    size = {"shortest_edge": reference.processor.image_processor.size["shortest_edge"]}
    inputs = reference.inputs(PROMPT, size={**size, "longest_edge": 12 * unit})
    assert by_request.token_ids == inputs["input_ids"][0].tolist()


def test_bad_options_are_refused_with_what_to_fix(qwen):
    _, family = qwen
    builder = PromptBuilder(family, MediaLimits(10**8), 4)
    for options, message in [
        ({"max_pixelz": 1000}, "max_pixelz"),
        ({"min_pixels": 5000, "max_pixels": 1000}, "above max_pixels"),
        ({"max_pixels": 10**12}, "outside"),
    ]:
        with pytest.raises(PromptError, match=message):
            builder.build(to_chat_inputs(PROMPT), options)


def test_placeholders_written_in_text_are_refused(qwen):
    _, family = qwen
    builder = PromptBuilder(family, MediaLimits(10**8), 4)
    with pytest.raises(PromptError, match="placeholder"):
        builder.build(to_chat_inputs([("user", ["<|image_pad|> hi", IMAGE])]))


def test_the_server_flag_is_parsed_and_checked():
    base = ["--model", "m", "--encoders", "e:1", "--decoders", "d:1"]
    args = build_parser().parse_args([*base, "--mm-processor-kwargs", '{"max_pixels": 4096}'])
    assert GatewayConfig.from_args(args).mm_processor_kwargs == {"max_pixels": 4096}
    for bad in ('{"max_pixels": "big"}', "[1, 2]", "not json"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*base, "--mm-processor-kwargs", bad])


def bmp(seed: int) -> bytes:
    """A BMP of seeded noise: every 20x20 one has the same length, whatever its pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (20, 20, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="BMP")
    return buffer.getvalue()


def test_an_item_sent_twice_in_a_request_is_decoded_and_hashed_once(qwen):
    _, family = qwen
    builder = PromptBuilder(family, MediaLimits(10**8), 4)
    decoded: list[bytes] = []
    decode = builder.decoder.decode
    builder.decoder.decode = lambda modality, data, options=None: (
        decoded.append(data) or decode(modality, data, options)
    )
    first, second = bmp(1), bmp(2)
    assert len(first) == len(second) and first != second
    sent = [first, "and", second, "then", IMAGE, "and", bytes(first), "?"]
    prompt = builder.build(to_chat_inputs([("user", sent)]))
    assert decoded == [first, second, IMAGE]  # the repeat of `first` reused its work
    hashes = [item.range.content_hash for item in prompt.items]
    assert hashes[0] == hashes[3] and len(set(hashes)) == 3
    offsets = [item.range.offset for item in prompt.items]
    assert offsets == sorted(offsets) and len(set(offsets)) == 4
