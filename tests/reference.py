"""The correctness oracle: the checkpoint's own `generate()` on the same inputs."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration

# Packed/chunked attention and one-shot attention differ by ~1e-6 in float32; a greedy
# difference is only acceptable where the reference's top two logits are this close.
NEAR_TIE = 1e-5


def noise_image(seed: int, width: int, height: int, mode: str = "RGB") -> bytes:
    """A PNG of seeded noise."""
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def to_template(messages: list[tuple[str, list[str | bytes]]]) -> list[dict]:
    return [
        {
            "role": role,
            "content": [
                {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"}
                for p in parts
            ],
        }
        for role, parts in messages
    ]


@dataclass
class ReferenceOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logits: list[torch.Tensor]  # [vocab] float32 per generated step


class Reference:
    def __init__(self, model_dir: Path):
        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.model = LlavaForConditionalGeneration.from_pretrained(model_dir).eval()
        self.hidden_size = self.model.config.text_config.hidden_size
        self.image_token_id = self.model.config.image_token_id

    def inputs(self, messages: list[tuple[str, list[str | bytes]]]) -> dict:
        text = self.processor.apply_chat_template(
            to_template(messages), add_generation_prompt=True, tokenize=False
        )
        images = [
            Image.open(io.BytesIO(p))
            for _, parts in messages
            for p in parts
            if isinstance(p, bytes)
        ]
        return self.processor(
            text=text, images=images or None, return_tensors="pt", add_special_tokens=False
        )

    @torch.inference_mode()
    def generate(
        self, messages: list[tuple[str, list[str | bytes]]], max_new_tokens: int
    ) -> ReferenceOutput:
        inputs = self.inputs(messages)
        out = self.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        prompt = inputs["input_ids"][0].tolist()
        return ReferenceOutput(
            prompt_token_ids=prompt,
            token_ids=out.sequences[0, len(prompt) :].tolist(),
            logits=[step[0].float() for step in out.logits],
        )


def assert_greedy_match(ours: list[int], reference: ReferenceOutput) -> None:
    """Tokens must be identical; at the first difference (if any) the reference must have
    been at a true near-tie, and then only the prefix up to it is compared."""
    for step, (mine, theirs) in enumerate(zip(ours, reference.token_ids, strict=False)):
        if mine == theirs:
            continue
        top2 = torch.topk(reference.logits[step], 2).values
        gap = float(top2[0] - top2[1])
        assert gap < NEAR_TIE, (
            f"greedy tokens differ at step {step} ({mine} vs reference {theirs}) and the "
            f"reference's top-2 logit gap is {gap:.3g}, not a near-tie: a real bug\n"
            f"ours:      {ours}\nreference: {reference.token_ids}"
        )
        return
    assert len(ours) == len(reference.token_ids), (ours, reference.token_ids)
