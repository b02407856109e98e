"""LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`): SigLIP tower, projector,
Qwen2 language model, 1-D positions.

An image alone in its prompt is cut into anyres tiles (a base view plus the tiles of the
best grid resolution) and its rows end each tile row with the model's newline row, so
its row count depends on its size. In a prompt with several images each one is the base
view only, plus one newline row. The model decides this from the number of images in
the prompt; here it is the derived processing option `anyres` (1 alone, 0 with others),
part of the content hash: the same picture in both settings is two cache entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch

from tessera.adapters.base import ItemPlacement, MediaInput
from tessera.adapters.hf_family import HFFamily
from tessera.media import ProcessingOptions

ANYRES = "anyres"


class LlavaOnevisionFamily(HFFamily):
    name = "llava-onevision"
    architectures = ("LlavaOnevisionForConditionalGeneration",)
    media_modules = ("vision_tower", "multi_modal_projector")
    option_limits = MappingProxyType({ANYRES: (0, 1)})

    def processing_options(self, requested: Mapping[str, int], num_items: int) -> ProcessingOptions:
        if requested:
            raise ValueError(
                f"{self.name} takes no processing options, got {', '.join(sorted(requested))}"
            )
        return ProcessingOptions.of({ANYRES: int(num_items == 1)})

    def check_options(self, options: ProcessingOptions) -> None:
        super().check_options(options)
        if options.get(ANYRES) is None:
            raise ValueError(f"{self.name} items need the processing option {ANYRES} (0 or 1)")

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        processor = self._processor
        if item.options.get(ANYRES):
            size = (item.image.height, item.image.width)
            rows = processor._get_num_multimodal_tokens(image_sizes=[size])["num_image_tokens"][0]
            return ItemPlacement(int(rows))
        # The base view and one newline row (the processor's replace_image_token).
        rows = processor.num_image_tokens + 1
        if processor.vision_feature_select_strategy == "default":
            rows -= 1
        return ItemPlacement(rows)

    @torch.inference_mode()
    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """One forward: tiled items as prompts of one image each, the others as one prompt
        of several images (the processor and the model both read `batch_num_images`). A
        lone untiled item is sent twice, since a "prompt" of one image would be tiled."""
        model = self._media_model()
        tiled = [i for i, item in enumerate(items) if item.options.get(ANYRES)]
        untiled = [i for i, item in enumerate(items) if not item.options.get(ANYRES)]
        samples = [[i] for i in tiled] + (
            [untiled * 2 if len(untiled) == 1 else untiled] if untiled else []
        )
        processed = self._processor.image_processor(
            [[items[i].image.image for i in sample] for sample in samples], return_tensors="pt"
        )
        config = self._config
        features = model.get_image_features(
            pixel_values=processed["pixel_values"].to(self.device, self.dtype),
            image_sizes=processed["image_sizes"].to(self.device),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
            vision_aspect_ratio=config.vision_aspect_ratio,
            batch_num_images=processed["batch_num_images"],
        ).pooler_output
        rows: dict[int, torch.Tensor] = {}
        for index, feature in zip([i for sample in samples for i in sample], features, strict=True):
            rows.setdefault(index, feature.to(self.dtype))  # the duplicate is dropped
        return [rows[index] for index in range(len(items))]
