"""Runs one engine step's work on the model: builds each chunk's input embeddings (token
embeddings, with fetched media rows written by position index), runs the language model
with the request's KV cache, and returns logits where a token is to be sampled.

Runs on the engine's model thread; it never waits on the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoder_service.embedding_client import FetchedRows
from decoder_service.scheduler import ScheduledWork
from tessera.adapters import ModelFamily


@dataclass(frozen=True)
class WorkInput:
    work: ScheduledWork
    rows: Sequence[FetchedRows]


class ModelRunner:
    def __init__(self, family: ModelFamily):
        self.family = family

    @torch.inference_mode()
    def run(self, inputs: Sequence[WorkInput]) -> list[torch.Tensor | None]:
        """Per work item: `[vocab]` float32 logits of its last position when it completes
        the prompt or decodes, else None."""
        return [self._run_one(item) for item in inputs]

    def _run_one(self, item: WorkInput) -> torch.Tensor | None:
        work, request = item.work, item.work.request
        family = self.family
        if request.kv_cache is None:
            request.kv_cache = family.new_kv_cache()
        token_ids = torch.tensor(
            [request.token_at(p) for p in range(work.start, work.end)], dtype=torch.long
        )
        embeds = family.embed_tokens(token_ids)
        for fetched in item.rows:
            # By position, never by token id: row r of the item goes to offset + r.
            first = fetched.slice.position_start - work.start
            embeds[first : first + fetched.slice.num_rows] = fetched.rows.to(
                embeds.device, embeds.dtype
            )
        positions = family.positions(
            request.num_prompt_tokens, request.spec.ranges, work.start, work.end
        )
        hidden = family.forward(embeds, positions, request.kv_cache)
        if not work.completes_prompt:
            return None
        return family.compute_logits(hidden[-1:])[0]
