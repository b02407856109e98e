"""Runs one engine step on the model: a single packed forward over every scheduled
request's tokens (prefill chunks and decode tokens together).

For each scheduled chunk (plain data: ids, tokens, block table; never a request object)
it embeds the tokens, writes fetched media rows into the
embeddings by position index (never by matching token ids), and computes positions and
KV slots from the request's block table; the attention itself is
`paged_attention.paged_attention`. Rows wider than the hidden size carry more planes
(Qwen3-VL deepstack): the first goes into the embeddings, the others to the family's
forward as `PackedMedia`, in packed order. Runs on the engine's model thread and never waits on
the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoder_service.embedding_client import FetchedRows
from decoder_service.paged_attention import AttentionMetadata, PagedKVStore, Segment
from decoder_service.scheduler import ScheduledChunk
from tessera.adapters import ModelFamily, PackedMedia


@dataclass(frozen=True)
class WorkInput:
    chunk: ScheduledChunk
    rows: Sequence[FetchedRows]


class ModelRunner:
    def __init__(self, family: ModelFamily, store: PagedKVStore):
        self.family = family
        self.store = store

    @torch.inference_mode()
    def run(self, inputs: Sequence[WorkInput]) -> list[torch.Tensor | None]:
        """Per chunk: `[vocab]` float32 logits of its last position if it samples."""
        family, device = self.family, self.family.device
        token_ids = [token for item in inputs for token in item.chunk.token_ids]
        embeds = family.embed_tokens(torch.tensor(token_ids, dtype=torch.long, device=device))
        media_mask = torch.zeros(len(token_ids), dtype=torch.bool, device=device)
        extra_planes: list[torch.Tensor] = []

        positions, segments = [], []
        slot_mapping: list[int] = []
        block_size = self.store.block_size
        offset = 0
        for item in inputs:
            work = item.chunk
            for fetched in item.rows:
                first = offset + fetched.slice.position_start - work.start
                last = first + fetched.slice.num_rows
                rows = fetched.rows.to(device, embeds.dtype)
                embeds[first:last] = rows[:, : family.hidden_size]
                if family.num_planes > 1:
                    media_mask[first:last] = True
                    extra_planes.append(rows[:, family.hidden_size :])
            positions.append(
                family.positions(work.num_prompt_tokens, work.items, work.start, work.end)
            )
            table = work.block_table
            slot_mapping += [
                table[p // block_size] * block_size + p % block_size
                for p in range(work.start, work.end)
            ]
            num_blocks = -(-work.end // block_size)
            segments.append(
                Segment(
                    offset,
                    offset + work.num_tokens,
                    work.start,
                    table[:num_blocks],
                    self._bidirectional(work),
                    work.request_id,
                )
            )
            offset += work.num_tokens

        slots = torch.tensor(slot_mapping, dtype=torch.long, device=device)
        media = PackedMedia(media_mask, torch.cat(extra_planes)) if extra_planes else None
        try:
            metadata = AttentionMetadata.plan(slots, segments, self.store.mirror)
            hidden = family.forward(
                embeds,
                torch.cat(positions, dim=-1),
                media,
                tessera_metadata=metadata,
                tessera_kv=self.store,
            )
        except BaseException:
            if self.store.mirror is not None:  # its rows may be written by some layers only
                self.store.mirror.clear()
            raise
        sampling = [i for i, item in enumerate(inputs) if item.chunk.samples]
        if not sampling:
            return [None] * len(inputs)
        last = torch.tensor([segments[i].query_end - 1 for i in sampling], device=device)
        logits = family.compute_logits(hidden.index_select(0, last))
        results: list[torch.Tensor | None] = [None] * len(inputs)
        for row, index in enumerate(sampling):
            results[index] = logits[row]
        return results

    def _bidirectional(self, work: ScheduledChunk) -> tuple[tuple[int, int], ...]:
        """Items of the work's positions whose tokens attend both ways, if the family's do."""
        if not self.family.attention.bidirectional_items:
            return ()
        return tuple(
            (item.offset, item.end)
            for item in work.items
            if item.offset < work.end and work.start < item.end
        )
