"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: dynamic-resolution images, multimodal RoPE, and
(Qwen3-VL) deepstack.

- Rows: the image is resized to multiples of `patch * merge` within `[min_pixels,
  max_pixels]` (the processor's own `smart_resize`), giving a patch grid (1, h, w) and
  h * w / merge^2 rows. `min_pixels`/`max_pixels` may be set per server and per request
  (vLLM's `mm_processor_kwargs`); they enter the content hash.
- Positions: 3-D, from each item's grid (`tessera.adapters.mrope`).
- Qwen3-VL's vision tower also gives one feature map per deepstack level, which the
  language model adds to the image positions' hidden states after its first layers. An
  item's rows carry them as extra planes: `[main | level 0 | level 1 | ...]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from tessera.adapters.base import ItemPlacement, LoadOptions, MediaInput, PackedMedia
from tessera.adapters.hf_family import HFFamily
from tessera.adapters.mrope import check_grid_layout, mrope_positions
from tessera.adapters.qwen_video import (
    IMAGE_OPTIONS,
    MAX_FPS,
    MAX_FRAMES_LIMIT,
    QwenVideo,
)
from tessera.media import ProcessingOptions
from tessera.placeholders import ItemLayout, Modality, PlaceholderRange
from tessera.video import FrameSampler

# Far above any real setting (Qwen's default max is 12.8 M px): a bound on what a caller
# may ask an encoder to resize an image to.
MAX_PIXELS_LIMIT = 64_000_000


class QwenVLFamily(HFFamily):
    """Qwen2-VL; the other two differ only in what the class attributes say."""

    name = "qwen2-vl"
    architectures = ("Qwen2VLForConditionalGeneration",)
    media_modules = ("visual",)
    option_limits = MappingProxyType(
        {
            "min_pixels": (1, MAX_PIXELS_LIMIT),
            "max_pixels": (1, MAX_PIXELS_LIMIT),
            "fps": (1, MAX_FPS),
            "num_frames": (1, MAX_FRAMES_LIMIT),
            "max_frames": (1, MAX_FRAMES_LIMIT),
        }
    )
    # Qwen3-VL: a video is one range per temporal step, each after its timestamp.
    video_range_per_frame = False

    def __init__(self, model_dir: Path, options: LoadOptions, fingerprint: str | None = None):
        super().__init__(model_dir, options, fingerprint)
        image_processor = self._processor.image_processor
        self._patch_size = int(image_processor.patch_size)
        self._merge_size = int(image_processor.merge_size)
        self._default_pixels = (
            int(image_processor.size["shortest_edge"]),
            int(image_processor.size["longest_edge"]),
        )
        model_merge = self._config.vision_config.spatial_merge_size
        if model_merge != self._merge_size:
            raise ValueError(
                f"{model_dir}: the processor merges {self._merge_size} patches per side, "
                f"the model {model_merge}"
            )
        # Qwen3-VL's deepstack levels ride beside the main plane of every row.
        levels = getattr(self._config.vision_config, "deepstack_visual_indexes", None) or []
        self.num_planes = 1 + len(levels)
        self._video = QwenVideo(
            self._processor, self._config, self.num_planes, self.video_range_per_frame
        )

    def _placeholder_token_ids(self) -> dict[Modality, int]:
        return {
            Modality.IMAGE: int(self._config.image_token_id),
            Modality.VIDEO: int(self._config.video_token_id),
        }

    def media_marker(self, modality: Modality) -> str:
        if modality == Modality.VIDEO:
            return self._processor.video_token
        return self._processor.image_token

    def placeholder_text(self, modality: Modality, num_rows: int) -> str:
        if modality == Modality.VIDEO:
            return self._processor.video_token * num_rows
        return self._processor.image_token * num_rows

    # -- processor side -------------------------------------------------------------

    def processing_options(self, requested: Mapping[str, int], num_items: int) -> ProcessingOptions:
        options = super().processing_options(requested, num_items)
        self._pixel_limits(options)
        return options

    def check_options(self, options: ProcessingOptions) -> None:
        super().check_options(options)
        self._pixel_limits(options)

    def item_options(self, options: ProcessingOptions, modality: Modality) -> ProcessingOptions:
        if modality == Modality.VIDEO:
            return self._video.item_options(options)
        return ProcessingOptions.of({k: v for k, v in options.values if k in IMAGE_OPTIONS})

    def video_sampler(self, options: ProcessingOptions, max_frames: int) -> FrameSampler:
        return self._video.sampler(options, max_frames)

    def _pixel_limits(self, options: ProcessingOptions) -> tuple[int, int]:
        min_pixels = options.get("min_pixels", self._default_pixels[0])
        max_pixels = options.get("max_pixels", self._default_pixels[1])
        if min_pixels > max_pixels:
            raise ValueError(f"min_pixels {min_pixels} is above max_pixels {max_pixels}")
        return min_pixels, max_pixels

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        if item.modality == Modality.VIDEO:
            video = item.video
            layout = self._video.layout(video)
            return ItemPlacement(
                layout.num_grid_rows,
                layout,
                num_ranges=self._video.num_ranges(layout),
                placeholder_text=self._video.placeholder_text(video, layout),
            )
        min_pixels, max_pixels = self._pixel_limits(item.options)
        height, width = smart_resize(
            item.image.height,
            item.image.width,
            factor=self._patch_size * self._merge_size,
            min_pixels=min_pixels,
            max_pixels=max_pixels,
        )
        grid = (1, height // self._patch_size, width // self._patch_size)
        layout = ItemLayout(grid, self._merge_size, self.num_planes)
        return ItemPlacement(layout.num_grid_rows, layout)

    # -- media encoder side --------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        if items and items[0].modality == Modality.VIDEO:
            return self._encode_videos(items)
        model = self._media_model()
        pixel_values, grids = [], []
        # Options differ per item; the processor takes one setting per call, the vision
        # tower all of them in one forward.
        for item in items:
            min_pixels, max_pixels = self._pixel_limits(item.options)
            processed = self._processor.image_processor(
                [item.image.image],
                size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
                return_tensors="pt",
            )
            pixel_values.append(processed["pixel_values"])
            grids.append(processed["image_grid_thw"])
        features = model.get_image_features(
            pixel_values=torch.cat(pixel_values).to(self.device, self.dtype),
            image_grid_thw=torch.cat(grids).to(self.device),
        )
        return [rows.to(self.dtype) for rows in self._rows_with_planes(features)]

    def _encode_videos(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        model = self._media_model()
        pixel_values, grids = self._video.pixel_values([item.video for item in items])
        features = model.get_video_features(
            pixel_values_videos=pixel_values.to(self.device, self.dtype),
            video_grid_thw=grids.to(self.device),
        )
        return [rows.to(self.dtype) for rows in self._rows_with_planes(features)]

    def _rows_with_planes(self, features: Any) -> Sequence[torch.Tensor]:
        return features.pooler_output

    # -- language model side ----------------------------------------------------------

    def check_layout(self, item: PlaceholderRange) -> None:
        check_grid_layout(item, self._merge_size, self.num_planes, self._ranges_per_frame(item))
        if item.layout.second_per_grid_t and self._video.tokens_per_second is None:
            raise ValueError(
                f"item at offset {item.offset}: {self.name} does not space video positions "
                "by time; its layout has second_per_grid_t 0"
            )

    def _ranges_per_frame(self, item: PlaceholderRange) -> bool:
        return self.video_range_per_frame and item.modality == Modality.VIDEO

    def positions(
        self, num_prompt_tokens: int, ranges: Sequence[PlaceholderRange], start: int, end: int
    ) -> torch.Tensor:
        tokens_per_second = self._video.tokens_per_second or 1
        return mrope_positions(ranges, start, end, tokens_per_second, self.device).unsqueeze(1)


class Qwen2_5_VLFamily(QwenVLFamily):
    name = "qwen2.5-vl"
    architectures = ("Qwen2_5_VLForConditionalGeneration",)


class Qwen3VLFamily(QwenVLFamily):
    name = "qwen3-vl"
    architectures = ("Qwen3VLForConditionalGeneration",)
    video_range_per_frame = True

    def _rows_with_planes(self, features: Any) -> Sequence[torch.Tensor]:
        levels = features.deepstack_features  # per level: one tensor per image
        return [
            torch.cat([main, *(level[index] for level in levels)], dim=-1)
            for index, main in enumerate(features.pooler_output)
        ]

    def _media_kwargs(self, media: PackedMedia | None) -> dict[str, Any]:
        if media is None:
            return {}
        return {
            "visual_pos_masks": media.mask.unsqueeze(0),
            "deepstack_visual_embeds": list(media.extra_planes.split(self.hidden_size, dim=-1)),
        }


class Qwen3VLMoeFamily(Qwen3VLFamily):
    """Qwen3-VL with a mixture-of-experts language model: each token is routed on its
    own, so packing requests into one forward changes nothing."""

    name = "qwen3-vl-moe"
    architectures = ("Qwen3VLMoeForConditionalGeneration",)
