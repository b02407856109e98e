"""Qwen-VL videos, each step the family's own processor's way.

- Frames: the video processor's `sample_frames` picks them from the container's frame
  count and rate under the item's options (`fps` or `num_frames`, vLLM's
  `mm_processor_kwargs`; default 2 per second as qwen-vl-utils), never more than
  `max_frames` (the gateway's --max-video-frames unless the request sets it), which the
  options carry so every encoder samples exactly the frames the gateway hashed.
- Rows: `temporal_patch_size` frames make one temporal step (the last frame repeats to
  fill the final step); frames are resized by the processor module's `smart_resize`
  (Qwen3-VL's bounds all frames' pixels together), giving the grid (t, h, w) and
  t * h * w / merge^2 rows.
- Prompt: the processor's own `replace_video_token` writes the placeholder text. Qwen2-VL
  and Qwen2.5-VL write one run of rows; Qwen3-VL writes each temporal step's rows after
  a `<2.5 seconds>` timestamp, so its video is one range per step.
- Positions: Qwen2.5-VL spaces a video's temporal positions by `tokens_per_second *
  second_per_grid_t` (`ItemLayout.second_per_grid_t`, from the sampled frame rate).

Example: a 4 s clip at 4 fps (16 frames) sampled at fps 2 gives 8 frames, indices
0, 2, ..., 14; 4 temporal steps; at 64 x 48 px with patch 14 and merge 2 the frames are
resized to 56 x 56, grid (4, 4, 4), 4 * 4 * 4 / 4 = 16 rows, second_per_grid_t = 2 / 2 = 1.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from transformers.models.qwen2_vl import video_processing_qwen2_vl as qwen2_video
from transformers.models.qwen3_vl import video_processing_qwen3_vl as qwen3_video
from transformers.video_utils import VideoMetadata

from tessera.media import ProcessingOptions
from tessera.placeholders import ItemLayout
from tessera.video import DecodedVideo, FrameSampler, VideoInfo

IMAGE_OPTIONS = ("min_pixels", "max_pixels")
VIDEO_OPTIONS = ("fps", "num_frames", "max_frames")
DEFAULT_FPS = 2  # qwen-vl-utils' sampling rate, and Qwen3-VL's processor default
# Bounds on what a caller may ask: a frame rate no camera passes, a frame count far
# above any context.
MAX_FPS = 240
MAX_FRAMES_LIMIT = 100_000


class QwenVideo:
    """A Qwen-VL family's video processing: sampling, placement, encoding."""

    def __init__(self, processor: Any, config: Any, num_planes: int, qwen3: bool):
        self._processor = processor
        self._video = processor.video_processor
        self._qwen3 = qwen3
        self._num_planes = num_planes
        self.patch_size = int(self._video.patch_size)
        self.merge_size = int(self._video.merge_size)
        self.temporal_patch_size = int(self._video.temporal_patch_size)
        # Qwen2.5-VL spaces temporal positions by time; Qwen2-VL and Qwen3-VL do not.
        self.tokens_per_second = getattr(config.vision_config, "tokens_per_second", None)
        self.default_fps = int(self._video.fps or DEFAULT_FPS)

    # -- options and sampling -----------------------------------------------------------

    def item_options(self, options: ProcessingOptions) -> ProcessingOptions:
        """A video item's options: its sampling settings, `fps` by default."""
        values = {k: v for k, v in options.values if k in VIDEO_OPTIONS}
        if "fps" in values and "num_frames" in values:
            raise ValueError("fps and num_frames cannot both be set; choose one")
        if "fps" not in values and "num_frames" not in values:
            values["fps"] = self.default_fps
        return ProcessingOptions.of(values)

    def sampler(self, options: ProcessingOptions, max_frames: int) -> FrameSampler:
        fps, num_frames = options.get("fps"), options.get("num_frames")
        max_frames = min(max_frames, options.get("max_frames", max_frames))
        step = self.temporal_patch_size

        def sample(info: VideoInfo) -> Sequence[int]:
            if info.total_num_frames < step:
                raise ValueError(
                    f"the video has {info.total_num_frames} frame(s); this model needs at "
                    f"least {step}"
                )
            metadata = VideoMetadata(
                total_num_frames=info.total_num_frames,
                fps=info.fps,
                width=info.width,
                height=info.height,
                duration=info.duration_seconds,
            )
            indices = self._sample(metadata, num_frames, fps, max_frames)
            if len(indices) > max_frames:
                if num_frames is not None:
                    raise ValueError(
                        f"num_frames {num_frames} is above the limit of {max_frames} frames "
                        "per video (--max-video-frames); ask for fewer"
                    )
                # Too long a clip at this rate: as many frames as allowed, evenly spread.
                indices = self._sample(metadata, max_frames // step * step, None, max_frames)
            return [int(i) for i in indices]

        return sample

    def _sample(
        self, metadata: VideoMetadata, num_frames: int | None, fps: int | None, max_frames: int
    ) -> Sequence[int]:
        try:
            indices = self._video.sample_frames(
                metadata, num_frames=num_frames, fps=fps, max_frames=max_frames
            )
        except (ValueError, ZeroDivisionError) as error:
            raise ValueError(f"cannot sample the video's frames: {error}") from None
        if len(indices) < self.temporal_patch_size:
            raise ValueError(
                f"sampling gives {len(indices)} frame(s); this model needs at least "
                f"{self.temporal_patch_size}: raise fps or num_frames"
            )
        return list(indices)

    # -- rows and prompt text ---------------------------------------------------------

    def layout(self, video: DecodedVideo) -> ItemLayout:
        height, width = self._resized(video)
        grid_t = math.ceil(video.num_frames / self.temporal_patch_size)
        grid = (grid_t, height // self.patch_size, width // self.patch_size)
        spacing = 0.0
        if self.tokens_per_second is not None:  # as the processor: patch / sampled fps
            spacing = self.temporal_patch_size / video.metadata().sampled_fps
        return ItemLayout(grid, self.merge_size, self._num_planes, spacing)

    def placeholder_text(self, video: DecodedVideo, layout: ItemLayout) -> str:
        inputs = {
            "video_grid_thw": torch.tensor([layout.grid_thw]),
            "video_metadata": [video.metadata()],
        }
        return self._processor.replace_video_token(inputs, 0)

    def num_ranges(self, layout: ItemLayout) -> int:
        return layout.grid_thw[0] if self._qwen3 else 1

    def _resized(self, video: DecodedVideo) -> tuple[int, int]:
        size = self._video.size
        factor = self.patch_size * self.merge_size
        if self._qwen3:
            return qwen3_video.smart_resize(
                num_frames=video.num_frames,
                height=video.height,
                width=video.width,
                temporal_factor=self.temporal_patch_size,
                factor=factor,
                min_pixels=size.shortest_edge,
                max_pixels=size.longest_edge,
            )
        return qwen2_video.smart_resize(
            video.height,
            video.width,
            factor=factor,
            min_pixels=size.shortest_edge,
            max_pixels=size.longest_edge,
        )

    # -- encoding -----------------------------------------------------------------------

    def pixel_values(self, videos: Sequence[DecodedVideo]) -> tuple[torch.Tensor, torch.Tensor]:
        """The processor's `pixel_values_videos` and `video_grid_thw` of the frames as
        sampled (no resampling), checked against the grids the prompt was placed with."""
        with warnings.catch_warnings():
            # The frames are read-only (what was hashed); the processor only reads them.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            processed = self._video(
                videos=[video.frames for video in videos],
                video_metadata=[video.metadata() for video in videos],
                do_sample_frames=False,
                cap_pixels_per_frame=False,
                return_tensors="pt",
            )
        grids = processed["video_grid_thw"]
        for video, grid in zip(videos, grids.tolist(), strict=True):
            expected = list(self.layout(video).grid_thw)
            if grid != expected:
                raise RuntimeError(f"the video processor made grid {grid}, placement {expected}")
        return processed["pixel_values_videos"], grids
