"""Qwen2-Audio (`Qwen2AudioForConditionalGeneration`): a Whisper-style audio encoder, a
linear projector and a Qwen2 language model with 1-D positions.

Rows come from the clip's length. The feature extractor pads every clip to its 30 s
window (3000 mel frames of 10 ms) and marks the frames that hold audio; the encoder's
convolution halves them and its pooling halves them again:

    frames = min(ceil(samples / hop_length), 3000)
    rows   = ((frames - 1) // 2 + 1 - 2) // 2 + 1

Example: 2.5 s at 16 kHz = 40000 samples -> 250 frames -> 125 -> 62 rows (about 25 rows
per second). A clip longer than the window would be cut by the feature extractor, so the
family takes at most one window per item and longer clips are refused at the front door.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.masking_utils import create_bidirectional_mask

from tessera.adapters.base import ItemPlacement, LoadOptions, MediaInput
from tessera.adapters.hf_family import HFFamily
from tessera.placeholders import Modality

# Frames whose rows are all the encoder gives a clip of fewer: below it a clip has none.
MIN_FRAMES = 2


class Qwen2AudioFamily(HFFamily):
    name = "qwen2-audio"
    architectures = ("Qwen2AudioForConditionalGeneration",)
    media_modules = ("audio_tower", "multi_modal_projector")

    def __init__(self, model_dir: Path, options: LoadOptions, fingerprint: str | None = None):
        super().__init__(model_dir, options, fingerprint)
        extractor = self._processor.feature_extractor
        self.audio_sampling_rate = int(extractor.sampling_rate)
        self.max_audio_seconds = extractor.n_samples / extractor.sampling_rate
        self._hop_length = int(extractor.hop_length)
        self._max_frames = int(extractor.nb_max_frames)

    def _placeholder_token_ids(self) -> dict[Modality, int]:
        return {Modality.AUDIO: int(self._config.audio_token_id)}

    # -- processor side -------------------------------------------------------------

    def media_marker(self, modality: Modality) -> str:
        return self._processor.audio_token

    def placeholder_text(self, modality: Modality, num_rows: int) -> str:
        return self._processor.audio_token * num_rows

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        frames = min(math.ceil(item.audio.num_samples / self._hop_length), self._max_frames)
        if frames < MIN_FRAMES:
            shortest_ms = 1000 * (self._hop_length + 1) / self.audio_sampling_rate
            raise ValueError(
                f"the clip is {1000 * item.audio.seconds:.1f} ms long; {self.name} needs at "
                f"least {shortest_ms:.1f} ms of audio"
            )
        return ItemPlacement(_rows_from_frames(frames))

    # -- media encoder side --------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """What the model's own forward does to its audio: features padded to the window,
        the encoder attending only to frames that hold audio, the projector, and each
        clip's rows cut to its length."""
        model = self._media_model()
        features = self._processor.feature_extractor(
            [item.audio.samples for item in items],
            sampling_rate=self.audio_sampling_rate,
            padding="max_length",
            return_attention_mask=True,
            return_tensors="pt",
        )
        mel = features["input_features"].to(self.device, self.dtype)
        num_frames = features["attention_mask"].sum(-1).to(self.device)
        return [rows.to(self.dtype) for rows in audio_rows(model, mel, num_frames)]


def audio_rows(model: Any, mel: torch.Tensor, num_frames: torch.Tensor) -> list[torch.Tensor]:
    """Qwen2-Audio's own audio path (as in `Qwen2AudioModel.forward`) on `model.model`:
    `mel` [clips, mel bins, 3000] padded features, `num_frames` [clips] frames that hold
    audio. The encoder attends only to those frames; each clip's rows are cut to its
    length after the projector."""
    tower = model.audio_tower
    conv_lengths, num_rows = tower._get_feat_extract_output_lengths(num_frames)
    max_conv_length = (mel.shape[-1] - 2) // 2 + 1
    positions = torch.arange(max_conv_length, device=mel.device)
    attention = create_bidirectional_mask(
        config=tower.config,
        inputs_embeds=torch.zeros(len(mel), max_conv_length, 1, dtype=mel.dtype),
        attention_mask=(positions[None, :] < conv_lengths[:, None]).long(),
    )
    rows = model.multi_modal_projector(tower(mel, attention_mask=attention).last_hidden_state)
    return [rows[index, : int(count)] for index, count in enumerate(num_rows)]


def _rows_from_frames(frames: int) -> int:
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1
