"""Voxtral (`VoxtralForConditionalGeneration`): a Whisper-style audio encoder, a two-layer
projector and a Llama-style language model with 1-D positions (the Ultravox shape).

Rows: a clip is cut into 30 s windows (the last one padded), each window is 3000 mel
frames -> 1500 encoder positions, and every 4 positions are stacked into one row before
the projector (the encoder's width times 4 is its `intermediate_size`):

    rows = 375 * ceil(samples / 480000)        (at 16 kHz; 12.5 rows per second)

Example: 45 s -> 2 windows -> 750 rows. Windows never see each other, so a clip of any
length is encoded window by window in one batch.

Prompt: Mistral's tokenizer (mistral-common) renders the conversation to token ids
itself, and it encodes each text chunk on its own and measures each clip, so text cannot
be expanded and re-tokenized as for the other families. The prompt is rendered with a
one-sample stand-in for every clip and each clip's run of `[AUDIO]` tokens is then set to
the clip's own row count.
"""

from __future__ import annotations

import base64
import io
import math
import wave
from collections.abc import Sequence
from pathlib import Path

import torch

from tessera.adapters.base import ChatMessageDict, ItemPlacement, LoadOptions, MediaInput
from tessera.adapters.hf_family import HFFamily
from tessera.placeholders import Modality, PlaceholderRange


class VoxtralFamily(HFFamily):
    name = "voxtral"
    architectures = ("VoxtralForConditionalGeneration",)
    media_modules = ("audio_tower", "multi_modal_projector")
    renders_token_ids = True

    def __init__(self, model_dir: Path, options: LoadOptions, fingerprint: str | None = None):
        super().__init__(model_dir, options, fingerprint)
        extractor = self._processor.feature_extractor
        audio = self._config.audio_config
        self.audio_sampling_rate = int(extractor.sampling_rate)
        self.max_audio_seconds = None  # longer clips take more windows
        self._window_samples = int(extractor.n_samples)
        self._window_frames = int(extractor.nb_max_frames)
        self._positions_per_row = int(audio.intermediate_size) // int(audio.hidden_size)
        self._rows_per_window = int(audio.max_source_positions) // self._positions_per_row
        self._stand_in = _silent_wav_base64(1, self.audio_sampling_rate)

    def _check_chat_template(self) -> None:
        """mistral-common renders the conversation; there is no Jinja template."""

    def _override_chat_template(self, template: str) -> None:
        raise ValueError(
            f"{self.name} renders prompts with Mistral's tokenizer (mistral-common), not a "
            "Jinja template: --chat-template cannot apply"
        )

    def _placeholder_token_ids(self) -> dict[Modality, int]:
        return {Modality.AUDIO: int(self._config.audio_token_id)}

    # -- processor side -------------------------------------------------------------

    def render_prompt_ids(
        self, messages: Sequence[ChatMessageDict], num_rows: Sequence[int]
    ) -> list[int]:
        conversation = [self._mistral_message(message) for message in messages]
        try:
            rendered = self._tokenizer.apply_chat_template(conversation, tokenize=True)
        except Exception as error:  # mistral-common's own exceptions are not ValueErrors
            raise ValueError(str(error)) from None
        # A BatchEncoding (ids, mask and the padded stand-in audio), or plain ids.
        token_ids = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        return self._set_run_lengths(token_ids, num_rows)

    def _mistral_message(self, message: ChatMessageDict) -> ChatMessageDict:
        content = message["content"]
        if isinstance(content, str):
            return message
        parts = [
            {"type": "audio", "base64": self._stand_in} if part["type"] == "audio" else part
            for part in content
        ]
        return {"role": message["role"], "content": parts}

    def _set_run_lengths(self, token_ids: list[int], num_rows: Sequence[int]) -> list[int]:
        """Each run of placeholder tokens (the k-th clip's stand-in) -> num_rows[k] of them."""
        audio = self.placeholder_token_ids[Modality.AUDIO]
        out: list[int] = []
        num_runs = 0
        for index, token in enumerate(token_ids):
            if token != audio:
                out.append(token)
            elif index == 0 or token_ids[index - 1] != audio:
                if num_runs == len(num_rows):
                    raise ValueError("the prompt holds more audio runs than clips")
                out += [audio] * num_rows[num_runs]
                num_runs += 1
        if num_runs != len(num_rows):
            raise ValueError(f"the tokenizer placed {num_runs} of {len(num_rows)} clips")
        return out

    def tokenize(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        num_windows = math.ceil(item.audio.num_samples / self._window_samples)
        return ItemPlacement(num_windows * self._rows_per_window)

    # -- media encoder side --------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """Every clip's windows in one forward: what the processor and the model's
        `get_audio_features` do to one conversation's audio."""
        model = self._media_model()
        extractor = self._processor.feature_extractor
        windows = []
        for item in items:
            features = extractor(
                item.audio.samples,
                sampling_rate=self.audio_sampling_rate,
                padding=True,
                truncation=False,
                pad_to_multiple_of=self._window_samples,
                return_tensors="pt",
            )["input_features"]
            # [1, mels, k * 3000] -> [k, mels, 3000]: one batch row per window.
            mels = features.shape[1]
            windows.append(features.reshape(mels, -1, self._window_frames).transpose(0, 1))
        rows = model.get_audio_features(
            torch.cat(windows).to(self.device, self.dtype)
        ).pooler_output
        counts = [self.item_placement(item).num_rows for item in items]
        return [part.to(self.dtype) for part in rows.split(counts)]

    # -- language model side ----------------------------------------------------------

    def check_layout(self, item: PlaceholderRange) -> None:
        super().check_layout(item)
        if item.length % self._rows_per_window:
            raise ValueError(
                f"item at offset {item.offset}: voxtral clips take a multiple of "
                f"{self._rows_per_window} rows (one run per 30 s window), not {item.length}"
            )


def _silent_wav_base64(num_samples: int, sampling_rate: int) -> str:
    """A 16-bit mono WAV of silence, base64: the stand-in clip mistral-common measures."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sampling_rate)
        out.writeframes(b"\x00\x00" * num_samples)
    return base64.b64encode(buffer.getvalue()).decode()
