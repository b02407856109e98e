"""Gemma 3 (`Gemma3ForConditionalGeneration`): SigLIP tower pooled to a fixed number of
rows per image, Gemma 3 language model with sliding-window layers.

Tokens inside one image attend to each other in both directions (the model's own mask:
causal OR same-image, AND the sliding window on local layers), so a prefill chunk never
cuts an image: the family declares it and the scheduler obeys. The chat template writes
`<start_of_image>`, which the processor replaces with a blank line, the begin marker,
one soft token per row, the end marker and a blank line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from tessera.adapters.base import AttentionRules, ItemPlacement, LoadOptions, MediaInput
from tessera.adapters.hf_family import HFFamily
from tessera.placeholders import Modality


class Gemma3Family(HFFamily):
    name = "gemma3"
    architectures = ("Gemma3ForConditionalGeneration",)
    media_modules = ("vision_tower", "multi_modal_projector")
    takes_processed_pixels = True
    attention = AttentionRules(split_items=False, bidirectional_items=True)

    def __init__(self, model_dir: Path, options: LoadOptions, fingerprint: str | None = None):
        super().__init__(model_dir, options, fingerprint)
        self.fixed_item_rows = int(self._processor.image_seq_length)
        if getattr(self._processor.image_processor, "do_pan_and_scan", False):
            raise ValueError(
                f"{model_dir}: pan-and-scan crops (do_pan_and_scan) are not supported yet; "
                "set it to false in the image processor's config"
            )
        text = self._config.get_text_config()
        if getattr(text, "attn_logit_softcapping", None) is not None:
            raise ValueError(f"{model_dir}: attention logit soft-capping is not supported")

    def media_marker(self, modality: Modality) -> str:
        return self._processor.boi_token

    def placeholder_text(self, modality: Modality, num_rows: int) -> str:
        if num_rows != self.fixed_item_rows:
            raise ValueError(f"gemma3 images take {self.fixed_item_rows} rows, not {num_rows}")
        return self._processor.full_image_sequence

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        return ItemPlacement(self.fixed_item_rows)

    @torch.inference_mode()
    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        features = (
            self._media_model()
            .get_image_features(pixel_values=self._pixel_values(items))
            .pooler_output
        )
        return [rows.to(self.dtype) for rows in features]
