"""The two in-process baselines, one request at a time on the checkpoint's own model:

- `hf-generate`: `model.generate()` on the processor's inputs, what a user would write
  without a server;
- `reencode-per-chunk`: chunked prefill over a DynamicCache that re-runs the vision tower
  for every chunk touching an item (what the embedding cache exists to remove), then
  greedy decoding. It must give generate()'s greedy tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.generation.streamers import BaseStreamer

from benchmarks.outcome import Outcome
from benchmarks.workloads import BenchRequest
from tessera.placeholders import overlap
from tests.reference import Reference


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


def image_ranges(
    input_ids: list[int], image_token_id: int, rows_per_image: int
) -> list[tuple[int, int]]:
    """(offset, length) of each image's placeholder rows, in prompt order (adjacent
    images make one run of placeholders, cut every `rows_per_image`)."""
    positions = [p for p, token in enumerate(input_ids) if token == image_token_id]
    if len(positions) % rows_per_image:
        raise ValueError(f"{len(positions)} placeholders is no multiple of {rows_per_image}")
    return [(positions[i], rows_per_image) for i in range(0, len(positions), rows_per_image)]


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
            encoder_passes=len(request.images),
            logits=[step[0].float() for step in out.logits],
        )


class ReencodePerChunk(InProcessArm):
    name = "reencode-per-chunk"

    def __init__(self, reference: Reference):
        self.reference = reference
        model = reference.model
        self.language_model = model.model.language_model
        self.lm_head = model.lm_head
        self.embed = model.get_input_embeddings()
        self.config = model.config

    def _encode(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """One vision-tower pass over one image: its [rows, hidden] placeholder rows."""
        return self.reference.model.model.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=self.config.vision_feature_layer,
            vision_feature_select_strategy=self.config.vision_feature_select_strategy,
        ).pooler_output[0]

    def _forward(self, embeds: torch.Tensor, start: int, cache: DynamicCache) -> torch.Tensor:
        positions = torch.arange(start, start + embeds.shape[1]).unsqueeze(0)
        hidden = self.language_model(
            inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True
        ).last_hidden_state
        return self.lm_head(hidden[:, -1]).float()[0]

    @torch.inference_mode()
    def run_one(self, request: BenchRequest) -> Outcome:
        started = time.perf_counter()
        inputs = self.reference.inputs(request.messages)
        ids = inputs["input_ids"]
        prompt = ids[0].tolist()
        ranges = image_ranges(prompt, self.reference.image_token_id, self.config.image_seq_length)
        pixel_values = inputs.get("pixel_values")
        cache = DynamicCache(config=self.config.text_config)
        passes = 0
        logits = None
        for start in range(0, len(prompt), request.chunk_tokens):
            end = min(start + request.chunk_tokens, len(prompt))
            embeds = self.embed(ids[:, start:end])
            for index, (offset, length) in enumerate(ranges):
                hit = overlap(start, end, offset, offset + length)
                if hit is None:
                    continue
                rows = self._encode(pixel_values[index : index + 1])
                passes += 1
                embeds[0, hit[0] - start : hit[1] - start] = rows[hit[0] - offset : hit[1] - offset]
            logits = self._forward(embeds, start, cache)
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
            logits = self._forward(embeds, len(prompt) + len(tokens) - 1, cache)
        return Outcome.from_times(
            token_ids=tokens,
            prompt_token_ids=prompt,
            started=started,
            token_times=times,
            encoder_passes=passes,
        )
