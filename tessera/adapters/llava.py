"""LLaVA-1.5 (`LlavaForConditionalGeneration`): CLIP-style vision tower + projector,
Llama-style language model, a fixed number of rows per image, 1-D positions."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tessera.adapters.base import ItemPlacement, MediaInput
from tessera.adapters.hf_family import HFFamily


class LlavaFamily(HFFamily):
    name = "llava"
    architectures = ("LlavaForConditionalGeneration",)
    media_modules = ("vision_tower", "multi_modal_projector")
    takes_processed_pixels = True

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        size = (item.image.height, item.image.width)
        counts = self._processor._get_num_multimodal_tokens(image_sizes=[size])
        return ItemPlacement(int(counts["num_image_tokens"][0]))

    @torch.inference_mode()
    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        features = (
            self._media_model()
            .get_image_features(
                pixel_values=self._pixel_values(items),
                vision_feature_layer=self._config.vision_feature_layer,
                vision_feature_select_strategy=self._config.vision_feature_select_strategy,
            )
            .pooler_output
        )
        return [rows.to(self.dtype) for rows in features]
