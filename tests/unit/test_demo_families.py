"""Every demo family's checkpoint: saved with save_pretrained, reloaded like a Hub
checkpoint (AutoProcessor + the architecture's own class), seeded, and alive: greedy
generate() depends on the image or audio clip it is given, and on the clips' order."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from tessera.demo_models import AUDIO_DEMO_FAMILIES, DEMO_FAMILIES, make_demo_model
from tessera.testbed.audio_files import wav_clip
from tessera.testbed.reference import Reference, noise_image

NEW_FAMILIES = [name for name in DEMO_FAMILIES if name != "llava"]  # llava: test_demo_model.py
MAX_NEW_TOKENS = 8


def greedy(reference: Reference, media: list, text: str) -> tuple[list[int], list[int]]:
    """(prompt ids, new ids) of generate() on one user message: `media` (encoded images
    or Audio clips) then `text`."""
    output = reference.generate([("user", [*media, text])], MAX_NEW_TOKENS)
    return output.prompt_token_ids, output.token_ids


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
    reference = Reference(model_dir)
    assert type(reference.model).__name__ == AutoConfig.from_pretrained(model_dir).architectures[0]
    # A chat template, or (Voxtral) Mistral's tokenizer, which renders conversations itself.
    assert reference.processor.chat_template or reference.renders_token_ids


def media(family: str, seed: int, size: tuple[int, int] = (60, 45)):
    """An item the family takes: a noise image of `size`, or a clip of size[0] / 40 s."""
    if family in AUDIO_DEMO_FAMILIES:
        return wav_clip(seed, size[0] / 40, rate=22_050)
    return noise_image(seed, *size)


def test_generate_depends_on_the_media_and_stays_in_text(family_dir):
    name, model_dir = family_dir
    reference = Reference(model_dir)
    model = reference.model
    outputs = set()
    for seed in (1, 2):
        _, new_ids = greedy(reference, [media(name, seed)], "What is it?")
        assert len(new_ids) == MAX_NEW_TOKENS or new_ids[-1] in _eos(model)
        special = set(reference.processor.tokenizer.all_special_ids) - set(_eos(model))
        assert not special & set(new_ids), "greedy output never emits a special token"
        outputs.add(tuple(new_ids))
    assert len(outputs) == 2, "two different items must give two different continuations"


def test_two_items_of_other_sizes_expand_to_their_own_rows_in_order(family_dir):
    name, model_dir = family_dir
    reference = Reference(model_dir)
    items = [media(name, 3, (90, 40)), media(name, 4, (35, 70))]
    prompt_ids, new_ids = greedy(reference, items, "Compare them.")
    assert new_ids
    max_positions = reference.model.config.get_text_config().max_position_embeddings
    assert len(prompt_ids) < max_positions
    if name in AUDIO_DEMO_FAMILIES:  # the order of the clips matters to the model
        _, swapped = greedy(reference, items[::-1], "Compare them.")
        assert swapped != new_ids


def _eos(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return eos if isinstance(eos, list) else [eos]
