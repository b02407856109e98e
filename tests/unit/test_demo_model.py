"""Tests for the offline random-weight LLaVA demo checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration

from tessera.demo_models.llava import DEMO_SIZES, IMAGE_TOKEN, build_demo_model, make_demo_model

N_NEW = 12


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny checkpoint (seed 0) shared by the module."""
    return make_demo_model(tmp_path_factory.mktemp("demo") / "tiny", seed=0, size="tiny")


@pytest.fixture(scope="module")
def tiny(tiny_dir: Path) -> tuple[LlavaForConditionalGeneration, object]:
    """The tiny checkpoint reloaded the way a server would load it."""
    model = LlavaForConditionalGeneration.from_pretrained(tiny_dir).eval()
    return model, AutoProcessor.from_pretrained(tiny_dir)


def noise_image(seed: int, width: int, height: int) -> Image.Image:
    """A seeded random RGB image."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def prompt(processor: object, text: str = "Describe the picture.") -> str:
    """A one-image chat prompt rendered with the checkpoint's template."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def greedy(
    model: LlavaForConditionalGeneration, processor: object, image: Image.Image
) -> list[int]:
    """The new tokens of a greedy generate() for one image."""
    inputs = processor(images=image, text=prompt(processor), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=N_NEW)
    return out[0, inputs.input_ids.shape[1] :].tolist()


def test_reload_roundtrip_is_exact(tiny: tuple) -> None:
    model, processor = tiny
    built, built_proc = build_demo_model(seed=0, size="tiny")
    ref = built.state_dict()
    got = model.state_dict()
    assert ref.keys() == got.keys()
    for name, tensor in ref.items():
        assert torch.equal(tensor, got[name]), name
    assert type(processor).__name__ == "LlavaProcessor"
    assert processor.tokenizer.get_vocab() == built_proc.tokenizer.get_vocab()


def test_same_seed_same_weights_other_seed_differs() -> None:
    a, _ = build_demo_model(seed=3)
    b, _ = build_demo_model(seed=3)
    c, _ = build_demo_model(seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], sc["lm_head.weight"])
    vision = "model.vision_tower.embeddings.patch_embedding.weight"
    assert not torch.equal(sa[vision], sc[vision])


def test_config_ids_are_consistent(tiny: tuple) -> None:
    model, processor = tiny
    tok = processor.tokenizer
    assert model.config.image_token_id == tok.convert_tokens_to_ids(IMAGE_TOKEN)
    assert model.config.text_config.vocab_size == len(tok)
    assert model.lm_head.out_features == len(tok)
    gen = model.generation_config
    assert gen.do_sample is False
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    assert model.config.text_config.eos_token_id == tok.eos_token_id
    # Zero lm_head rows keep greedy decoding from emitting image placeholders.
    assert not model.lm_head.weight[model.config.image_token_id].any()


def test_image_token_is_atomic_and_expands(tiny: tuple) -> None:
    model, processor = tiny
    tok = processor.tokenizer
    assert tok.tokenize(f"a{IMAGE_TOKEN}b") == ["a", IMAGE_TOKEN, "b"]
    inputs = processor(
        images=noise_image(0, 40, 30), text=f"hi {IMAGE_TOKEN} there", return_tensors="pt"
    )
    assert int((inputs.input_ids == model.config.image_token_id).sum()) == 16
    assert tuple(inputs.pixel_values.shape) == (1, 3, 56, 56)


def test_chat_template_renders_parts(tiny: tuple) -> None:
    _, processor = tiny
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image"},
                {"type": "text", "text": " what is it?"},
            ],
        },
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "And now?"},
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<s><|system|>\nBe brief.</s>\n"
        f"<|user|>\nLook: {IMAGE_TOKEN} what is it?</s>\n"
        "<|assistant|>\nA cat.</s>\n"
        "<|user|>\nAnd now?</s>\n"
        "<|assistant|>\n"
    )
    assert processor.tokenizer.chat_template == processor.chat_template


def test_greedy_output_depends_on_image(tiny: tuple) -> None:
    model, processor = tiny
    first = greedy(model, processor, noise_image(1, 40, 30))
    second = greedy(model, processor, noise_image(2, 64, 64))
    assert first != second
    assert len(set(first)) > 1 and len(set(second)) > 1


def test_image_rows_position_matters(tiny: tuple) -> None:
    """Rows written one position off must change the output: the model sees positions."""
    model, processor = tiny
    inputs = processor(images=noise_image(5, 64, 64), text=prompt(processor), return_tensors="pt")
    ids = inputs.input_ids
    with torch.no_grad():
        rows = model.model.get_image_features(pixel_values=inputs.pixel_values).pooler_output
        assert len(rows) == 1 and tuple(rows[0].shape) == (16, model.config.text_config.hidden_size)
        where = (ids[0] == model.config.image_token_id).nonzero()[:, 0]
        text = model.get_input_embeddings()(ids)
        logits = []
        for shift in (0, 1):
            emb = text.clone()
            emb[0, where + shift] = rows[0]
            logits.append(model(inputs_embeds=emb).logits[0, -1])
        reference = model(**inputs).logits[0, -1]
    assert torch.allclose(logits[0], reference, atol=1e-4)
    assert (logits[0] - logits[1]).abs().max() > 1e-2


def test_logits_are_spread(tiny: tuple) -> None:
    """Top-1 and top-2 logits are not near-ties, so greedy choices are stable."""
    model, processor = tiny
    inputs = processor(images=noise_image(6, 50, 70), text=prompt(processor), return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    assert float((gaps > 1e-3).float().mean()) > 0.9


def test_progress_and_bad_size(tmp_path: Path) -> None:
    lines: list[str] = []
    with pytest.raises(ValueError, match="unknown demo model size"):
        make_demo_model(tmp_path / "x", size="huge", progress=lines.append)
    build_demo_model(progress=lines.append)
    assert lines[0] == "training tokenizer"


def test_bench_size() -> None:
    spec = DEMO_SIZES["bench"]
    assert spec.image_rows == 256
    model, processor = build_demo_model(seed=0, size="bench")
    assert model.config.text_config.hidden_size == 512
    assert model.config.text_config.max_position_embeddings == 4096
    assert model.config.image_seq_length == 256
    inputs = processor(images=noise_image(0, 32, 32), text=IMAGE_TOKEN, return_tensors="pt")
    assert int((inputs.input_ids == model.config.image_token_id).sum()) == 256
