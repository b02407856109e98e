"""The two in-process baselines, one request at a time on the checkpoint's own model:

- `hf-generate`: `model.generate()` on the processor's inputs, what a user would write
  without a server;
- `reencode-per-chunk`: chunked prefill over a DynamicCache that re-runs the vision tower
  for every chunk touching an item (what the embedding cache exists to remove), then
  greedy decoding. It must give generate()'s greedy tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from transformers import DynamicCache
from transformers.generation.streamers import BaseStreamer

from benchmarks.outcome import Outcome
from benchmarks.workloads import BenchRequest
from tessera.adapters.qwen2_audio import audio_rows
from tessera.placeholders import overlap
from tessera.testbed.reference import Reference


class _Clock(BaseStreamer):
    """Records when generate() emits each new token (the first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if self._prompt_seen:
            self.times.append(time.perf_counter())
        self._prompt_seen = True

    def end(self) -> None:
        pass


def queue_waits(outcomes: Sequence[Outcome], concurrency: int) -> None:
    """Adds to each outcome's TTFT and latency the wait of a FIFO single server fed by
    `concurrency` closed-loop clients (each sends its next request when one returns)."""
    arrivals = [0.0] * min(max(1, concurrency), len(outcomes))
    now = 0.0
    for outcome in outcomes:
        arrival = arrivals.pop(0)
        wait = max(0.0, now - arrival)
        now = max(now, arrival) + outcome.latency_s
        outcome.ttft_s += wait
        outcome.latency_s += wait
        arrivals.append(now)
        arrivals.sort()


class InProcessArm:
    """Runs requests one at a time in this process, whatever the client concurrency."""

    name = ""

    def run_one(self, request: BenchRequest) -> Outcome:
        raise NotImplementedError

    def run(
        self, requests: Sequence[BenchRequest], concurrency: int
    ) -> tuple[list[Outcome], float]:
        """Serves the requests one after another. With `concurrency` > 1 clients in a
        closed loop, each request would first wait in line for the ones ahead of it: its
        TTFT and latency include that wait, computed from the measured service times."""
        started = time.perf_counter()
        outcomes = [self.run_one(request) for request in requests]
        wall = time.perf_counter() - started
        queue_waits(outcomes, concurrency)
        return outcomes, wall


class HfGenerate(InProcessArm):
    name = "hf-generate"

    def __init__(self, reference: Reference):
        self.reference = reference

    @torch.inference_mode()
    def run_one(self, request: BenchRequest) -> Outcome:
        started = time.perf_counter()
        inputs = self.reference.inputs(request.messages)
        clock = _Clock()
        out = self.reference.model.generate(
            **inputs,
            max_new_tokens=request.max_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            streamer=clock,
        )
        prompt = inputs["input_ids"][0].tolist()
        return Outcome.from_times(
            token_ids=out.sequences[0, len(prompt) :].tolist(),
            prompt_token_ids=prompt,
            started=started,
            token_times=clock.times,
            encoder_passes=len(request.items),
            logits=[step[0].float().cpu() for step in out.logits],
            run_on=self.reference.run_on,
        )


AUDIO_ARCHITECTURES = ("Qwen2AudioForConditionalGeneration", "VoxtralForConditionalGeneration")


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Consecutive positions as (offset, length) runs."""
    runs: list[tuple[int, int]] = []
    for position in positions:
        if runs and runs[-1][0] + runs[-1][1] == position:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((position, 1))
    return runs


def _qwen2_audio_rows(model, features: torch.Tensor, frames: torch.Tensor, clip: int):
    rows = audio_rows(model, features[clip : clip + 1], frames[clip : clip + 1])[0]
    return rows, []


def _voxtral_rows(model, windows: torch.Tensor):
    return model.get_audio_features(windows).pooler_output, []


@dataclass(frozen=True)
class _Item:
    """One item of a prompt: its placeholder rows and how to encode it alone."""

    offset: int
    length: int
    encode: Callable[[], tuple[torch.Tensor, list[torch.Tensor]]]  # rows, deepstack levels


class ReencodePerChunk(InProcessArm):
    """LLaVA-1.5, Qwen-VL (1-D or multimodal RoPE, deepstack), Qwen2-Audio and Voxtral:
    the families whose prefill may be cut anywhere; others (bidirectional or tiled
    images) are not offered."""

    name = "reencode-per-chunk"

    def __init__(self, reference: Reference):
        self.reference = reference
        model = reference.model
        self.language_model = model.model.language_model
        self.lm_head = model.lm_head
        self.embed = model.get_input_embeddings()
        self.config = model.config
        self.mrope = hasattr(model.model, "get_rope_index")

    @staticmethod
    def supports(reference: Reference) -> bool:
        return type(reference.model).__name__ in {
            "LlavaForConditionalGeneration",
            "Qwen2VLForConditionalGeneration",
            "Qwen2_5_VLForConditionalGeneration",
            "Qwen3VLForConditionalGeneration",
            "Qwen3VLMoeForConditionalGeneration",
            *AUDIO_ARCHITECTURES,
        }

    def _items(self, inputs: dict, prompt: list[int]) -> list[_Item]:
        """Each item's range (its placeholder positions, in order) and its encoder."""
        positions = [p for p, t in enumerate(prompt) if t == self.reference.placeholder_token_id]
        model = self.reference.model.model
        if type(self.reference.model).__name__ in AUDIO_ARCHITECTURES:
            return self._audio_items(inputs, positions)
        if not self.mrope:  # LLaVA: a fixed number of rows, one pixel tensor per image
            rows = [self.config.image_seq_length] * len(inputs.get("pixel_values", []))
            pixels = [inputs["pixel_values"][i : i + 1] for i in range(len(rows))]
            encoders = [partial(self._encode_llava, model, pixel_values) for pixel_values in pixels]
        else:  # Qwen-VL: rows and patches from each image's grid
            grids = inputs.get("image_grid_thw", torch.empty(0, 3, dtype=torch.long))
            merge = self.config.vision_config.spatial_merge_size
            rows = [int(g.prod()) // merge**2 for g in grids]
            patches = (
                torch.split(inputs["pixel_values"], [int(g.prod()) for g in grids])
                if len(grids)
                else []
            )
            encoders = [
                partial(self._encode_qwen, model, pv, grids[i : i + 1])
                for i, pv in enumerate(patches)
            ]
        items, cursor = [], 0
        for length, encode in zip(rows, encoders, strict=True):
            items.append(_Item(positions[cursor], length, encode))
            cursor += length
        if cursor != len(positions):
            raise ValueError(f"{len(positions)} placeholders, but the images have {cursor} rows")
        return items

    def _audio_items(self, inputs: dict, positions: list[int]) -> list[_Item]:
        """One item per run of placeholders: Qwen2-Audio's k-th clip, or Voxtral's k-th
        clip of `length / rows_per_window` 30 s windows."""
        runs = _runs(positions)
        model = self.reference.model.model
        features = inputs["input_features"]
        if "feature_attention_mask" in inputs:  # Qwen2-Audio: one feature row per clip
            frames = inputs["feature_attention_mask"].sum(-1)
            return [
                _Item(offset, length, partial(_qwen2_audio_rows, model, features, frames, k))
                for k, (offset, length) in enumerate(runs)
            ]
        audio = self.config.audio_config
        rows_per_window = audio.max_source_positions * audio.hidden_size // audio.intermediate_size
        items, window = [], 0
        for offset, length in runs:
            windows = features[window : window + length // rows_per_window]
            items.append(_Item(offset, length, partial(_voxtral_rows, model, windows)))
            window += length // rows_per_window
        return items

    def _encode_llava(self, model, pixel_values: torch.Tensor):
        rows = model.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=self.config.vision_feature_layer,
            vision_feature_select_strategy=self.config.vision_feature_select_strategy,
        ).pooler_output[0]
        return rows, []

    @staticmethod
    def _encode_qwen(model, pixel_values: torch.Tensor, grid: torch.Tensor):
        features = model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid)
        levels = getattr(features, "deepstack_features", None) or []
        return features.pooler_output[0], [level[0] for level in levels]

    def _positions(self, inputs: dict, num_prompt: int):
        """A function of (start, end) giving the positions of those sequence indices."""
        if not self.mrope:
            return lambda start, end: torch.arange(start, end).unsqueeze(0)
        ids = inputs["input_ids"]
        if "image_grid_thw" not in inputs:
            return lambda start, end: torch.arange(start, end).expand(3, 1, -1)
        whole, delta = self.reference.model.model.get_rope_index(
            ids,
            mm_token_type_ids=inputs["mm_token_type_ids"],
            image_grid_thw=inputs["image_grid_thw"],
        )

        def positions(start: int, end: int) -> torch.Tensor:
            if end <= num_prompt:
                return whole[:, :, start:end]
            return (torch.arange(start, end) + int(delta)).expand(3, 1, -1)

        return positions

    def _forward(self, embeds, positions, cache: DynamicCache, deepstack: dict) -> torch.Tensor:
        hidden = self.language_model(
            inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True, **deepstack
        ).last_hidden_state
        return self.lm_head(hidden[:, -1]).float()[0]

    @torch.inference_mode()
    def run_one(self, request: BenchRequest) -> Outcome:
        started = time.perf_counter()
        inputs = self.reference.inputs(request.messages)
        ids = inputs["input_ids"]
        prompt = ids[0].tolist()
        items = self._items(inputs, prompt)
        positions = self._positions(inputs, len(prompt))
        cache = DynamicCache(config=self.config.get_text_config())
        passes = 0
        logits = None
        for start in range(0, len(prompt), request.chunk_tokens):
            end = min(start + request.chunk_tokens, len(prompt))
            embeds = self.embed(ids[:, start:end])
            mask = torch.zeros(1, end - start, dtype=torch.bool)
            levels: list[list[torch.Tensor]] = []
            for item in items:
                hit = overlap(start, end, item.offset, item.offset + item.length)
                if hit is None:
                    continue
                rows, deep = item.encode()
                passes += 1
                first, last = hit[0] - item.offset, hit[1] - item.offset
                embeds[0, hit[0] - start : hit[1] - start] = rows[first:last]
                mask[0, hit[0] - start : hit[1] - start] = True
                levels.append([level[first:last] for level in deep])
            deepstack = {}
            if levels and levels[0]:  # Qwen3-VL: the chunk's rows of every level
                deepstack = {
                    "visual_pos_masks": mask,
                    "deepstack_visual_embeds": [
                        torch.cat(parts) for parts in zip(*levels, strict=True)
                    ],
                }
            logits = self._forward(embeds, positions(start, end), cache, deepstack)
        tokens: list[int] = []
        times: list[float] = []
        eos = self.reference.model.generation_config.eos_token_id
        eos_ids = set(eos) if isinstance(eos, list) else {eos}
        while True:
            token = int(torch.argmax(logits))
            tokens.append(token)
            times.append(time.perf_counter())
            if len(tokens) >= request.max_tokens or token in eos_ids:
                break
            embeds = self.embed(torch.tensor([[token]]))
            index = len(prompt) + len(tokens) - 1
            logits = self._forward(embeds, positions(index, index + 1), cache, {})
        return Outcome.from_times(
            token_ids=tokens,
            prompt_token_ids=prompt,
            started=started,
            token_times=times,
            encoder_passes=passes,
        )
