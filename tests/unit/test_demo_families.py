"""Every demo family's checkpoint: saved with save_pretrained, reloaded like a Hub
checkpoint (AutoProcessor + the architecture's own class), seeded, and alive: greedy
generate() depends on the image or audio clip it is given, and on the clips' order."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import transformers
from PIL import Image
from transformers import AutoConfig, AutoProcessor

from tessera.client import Audio
from tessera.demo_models import AUDIO_DEMO_FAMILIES, DEMO_FAMILIES, make_demo_model
from tests.audio_files import wav_clip
from tests.reference import noise_image, reference_audio

NEW_FAMILIES = [name for name in DEMO_FAMILIES if name != "llava"]  # llava: test_demo_model.py
MAX_NEW_TOKENS = 8


def load(model_dir: Path):
    config = AutoConfig.from_pretrained(model_dir)
    model_class = getattr(transformers, config.architectures[0])
    model = model_class.from_pretrained(model_dir).eval()
    return model, AutoProcessor.from_pretrained(model_dir)


def greedy(model, processor, media: list, text: str) -> tuple[list[int], list[int]]:
    """`media`: encoded images (bytes) or Audio clips."""
    content = [{"type": "audio" if isinstance(m, Audio) else "image"} for m in media] + [
        {"type": "text", "text": text}
    ]
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    if media and isinstance(media[0], Audio):
        rate = processor.feature_extractor.sampling_rate
        clips = [reference_audio(clip.data, rate) for clip in media]
        inputs = processor(text=prompt, audio=clips, sampling_rate=rate, return_tensors="pt")
    else:
        pictures = [Image.open(io.BytesIO(data)) for data in media]
        inputs = processor(text=prompt, images=pictures or None, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    prompt_ids = inputs["input_ids"][0].tolist()
    return prompt_ids, out[0, len(prompt_ids) :].tolist()


@pytest.fixture(scope="module", params=NEW_FAMILIES)
def family_dir(request, tmp_path_factory) -> tuple[str, Path]:
    name = request.param
    return name, make_demo_model(tmp_path_factory.mktemp(name) / "tiny", family=name, seed=0)


def test_reloads_seeded_and_deterministic(family_dir, tmp_path):
    name, model_dir = family_dir
    again = make_demo_model(tmp_path / "again", family=name, seed=0)
    other = make_demo_model(tmp_path / "other", family=name, seed=1)
    weights = sorted(p.name for p in model_dir.glob("*.safetensors"))
    assert weights
    for file in weights:
        assert (model_dir / file).read_bytes() == (again / file).read_bytes(), file
        assert (model_dir / file).read_bytes() != (other / file).read_bytes(), file
    model, processor = load(model_dir)
    assert type(model).__name__ == AutoConfig.from_pretrained(model_dir).architectures[0]
    assert processor.chat_template, "the processor carries the chat template"


def media(family: str, seed: int, size: tuple[int, int] = (60, 45)):
    """An item the family takes: a noise image of `size`, or a clip of size[0] / 40 s."""
    if family in AUDIO_DEMO_FAMILIES:
        return wav_clip(seed, size[0] / 40, rate=22_050)
    return noise_image(seed, *size)


def test_generate_depends_on_the_media_and_stays_in_text(family_dir):
    name, model_dir = family_dir
    model, processor = load(model_dir)
    outputs = set()
    for seed in (1, 2):
        _, new_ids = greedy(model, processor, [media(name, seed)], "What is it?")
        assert len(new_ids) == MAX_NEW_TOKENS or new_ids[-1] in _eos(model)
        special = set(processor.tokenizer.all_special_ids) - set(_eos(model))
        assert not special & set(new_ids), "greedy output never emits a special token"
        outputs.add(tuple(new_ids))
    assert len(outputs) == 2, "two different items must give two different continuations"


def test_two_items_of_other_sizes_expand_to_their_own_rows_in_order(family_dir):
    name, model_dir = family_dir
    model, processor = load(model_dir)
    items = [media(name, 3, (90, 40)), media(name, 4, (35, 70))]
    prompt_ids, new_ids = greedy(model, processor, items, "Compare them.")
    assert new_ids
    assert len(prompt_ids) < model.config.get_text_config().max_position_embeddings
    if name in AUDIO_DEMO_FAMILIES:  # the order of the clips matters to the model
        _, swapped = greedy(model, processor, items[::-1], "Compare them.")
        assert swapped != new_ids


def _eos(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return eos if isinstance(eos, list) else [eos]
