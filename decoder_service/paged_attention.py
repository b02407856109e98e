"""The engine's own attention for packed forwards over a paged KV cache.

One forward carries every scheduled request's tokens back to back (batch of one). The
language model computes Q, K, V and RoPE as usual; this function, registered with
transformers' AttentionInterface, writes each new token's K/V into its slot of the
paged store, then attends each request's queries to its own context (gathered through
its block table, whole blocks at a time) with a causal offset: a query at position p sees
keys at positions <= p. The step's decode tokens (one query each) are attended together
in one call (`DecodeBatch`), over the contexts the decode mirror keeps between steps
(`decode_mirror.py`); those it does not hold are gathered here and attended in a second
call. Prefill chunks are attended one by one.

Two rules widen or narrow that, as the model's own mask does (Gemma 3):
- inside a bidirectional item `[s, e)` a query sees every key of the item;
- a sliding-window layer (the model passes `sliding_window=W`) hides keys at or before
  `p - W`, applied after the item rule: AND(window, OR(causal, same item)).

Everything here is device-agnostic torch; the same code runs on CUDA.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface

from decoder_service.decode_mirror import DecodeMirror, MirrorStep

ATTENTION_NAME = "tessera_paged"


@dataclass(frozen=True)
class Segment:
    """One request's part of a packed forward."""

    query_start: int  # packed index of its first new token
    query_end: int
    num_past: int  # tokens already in its KV cache before this step
    # [>= blocks_for(num_past + num_new)] blocks of its context, in order (a longer table
    # is fine: only the first num_past + num_new slots are read).
    block_table: tuple[int, ...]
    # Position ranges [start, end) of items whose tokens see each other both ways.
    bidirectional: tuple[tuple[int, int], ...] = ()
    request_id: str = ""  # names its row in the decode mirror (none: gathered)

    @property
    def num_new(self) -> int:
        return self.query_end - self.query_start

    @property
    def num_context(self) -> int:
        return self.num_past + self.num_new

    @property
    def is_decode(self) -> bool:
        """One query that sees every key before it (plain causal, or a window): attended
        with the step's other decode queries in one batched call."""
        return self.num_new == 1 and not self.bidirectional


@dataclass(frozen=True)
class DecodeBatch:
    """Every single-query segment of a step, attended together: their block tables are
    padded to the longest (padding reads block 0 and is masked out), so each layer does
    one gather of whole blocks and one SDPA call for the batch.

    Two requests of 20 and 35 context tokens, block size 16: tables [[7, 2], [4, 9, 5]]
    -> [[7, 2, 0], [4, 9, 5]], keys [2, 48]; request 0 sees keys 0..19, request 1 0..34.
    """

    query_indices: torch.Tensor  # [B] packed index of each query
    block_tables: torch.Tensor  # [B, max_blocks]
    context_lens: torch.Tensor  # [B] keys each query sees (its own position + 1)
    # Set: the keys and values come from the decode mirror's rows (this order), not a
    # gather of the block tables.
    mirror: MirrorStep | None = None
    # Sliding window (None: none) -> [B, 1, 1, max_blocks * block_size] visible keys.
    # Built on the first layer that asks and shared by the others.
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict, compare=False)

    @classmethod
    def split(
        cls, segments: Sequence[Segment], device: torch.device, mirror: DecodeMirror | None
    ) -> tuple[DecodeBatch, ...]:
        """The step's decode segments as batches: the mirrored ones (in row order), then
        those the mirror left out, gathered; one gathered batch without a mirror."""
        step = mirror.plan([s.request_id for s in segments], segments) if mirror else None
        if step is None:
            return (cls.of(segments, device),)
        mirrored = set(step.order)
        rest = [s for i, s in enumerate(segments) if i not in mirrored]
        batches = (cls.of([segments[i] for i in step.order], device, step),)
        return batches + ((cls.of(rest, device),) if rest else ())

    @classmethod
    def of(
        cls, segments: Sequence[Segment], device: torch.device, mirror: MirrorStep | None = None
    ) -> DecodeBatch:
        width = max(len(s.block_table) for s in segments)
        tables = [(*s.block_table, *[0] * (width - len(s.block_table))) for s in segments]
        return cls(
            torch.tensor([s.query_start for s in segments], device=device),
            torch.tensor(tables, dtype=torch.long, device=device),
            torch.tensor([s.num_context for s in segments], device=device),
            mirror,
        )

    def mask(self, block_size: int, sliding_window: int | None) -> torch.Tensor:
        if sliding_window not in self.masks:
            num_keys = self.block_tables.shape[1] * block_size
            keys = torch.arange(num_keys, device=self.context_lens.device).unsqueeze(0)
            lens = self.context_lens.unsqueeze(1)
            visible = keys < lens
            if sliding_window is not None:  # the query sits at position len - 1
                visible &= keys > lens - 1 - sliding_window
            self.masks[sliding_window] = visible[:, None, None, :]
        return self.masks[sliding_window]


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_packed_tokens] slot each new token's K/V goes to
    segments: tuple[Segment, ...]  # multi-token segments (prefill chunks), one by one
    block_tables: tuple[torch.Tensor, ...]  # each segment's block table, `[1, blocks]`
    decodes: tuple[DecodeBatch, ...] = ()  # the single-query segments: one or two batches

    @classmethod
    def plan(
        cls,
        slot_mapping: torch.Tensor,
        segments: Sequence[Segment],
        mirror: DecodeMirror | None = None,
    ) -> AttentionMetadata:
        """Splits a step's segments into the decode batch and the rest; every tensor the
        layers need is made here, once per step (and with a `mirror`, its step planned:
        every forward, decodes or none)."""
        device = slot_mapping.device
        decode = [s for s in segments if s.is_decode]
        batches = DecodeBatch.split(decode, device, mirror) if decode else ()
        if mirror is not None and not decode:
            mirror.clear()  # rows of requests absent from a forward are not kept
        prefill = tuple(s for s in segments if not s.is_decode)
        tables = tuple(
            torch.tensor([s.block_table], dtype=torch.long, device=device) for s in prefill
        )
        return cls(slot_mapping, prefill, tables, batches)


class PagedKVStore:
    """Per-layer K and V tensors of `[num_blocks * block_size, num_kv_heads, head_dim]`;
    with `max_mirror_bytes`, a `DecodeMirror` of the decode batch beside them."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        max_mirror_bytes: int = 0,
    ):
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.mirror = (
            DecodeMirror(
                num_layers, block_size, num_kv_heads, head_dim, dtype, device, max_mirror_bytes
            )
            if max_mirror_bytes > 0
            else None
        )

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    def slots(
        self, block_table: list[int], start: int, end: int, device: torch.device
    ) -> torch.Tensor:
        """Slots of positions `[start, end)` of a sequence with this block table."""
        positions = torch.arange(start, end, device=device)
        blocks = torch.tensor(block_table, dtype=torch.long, device=device)
        return blocks[positions // self.block_size] * self.block_size + positions % self.block_size


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    tessera_metadata: AttentionMetadata | None = None,
    tessera_kv: PagedKVStore | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """query `[1, heads, T, d]`, key/value `[1, kv_heads, T, d]` -> `[1, T, heads, d]`."""
    if tessera_metadata is None or tessera_kv is None:
        raise RuntimeError("tessera_paged attention needs tessera_metadata and tessera_kv")
    layer = module.layer_idx
    k_cache, v_cache = tessera_kv.keys[layer], tessera_kv.values[layer]
    k_cache.index_copy_(0, tessera_metadata.slot_mapping, key[0].transpose(0, 1).to(k_cache.dtype))
    v_cache.index_copy_(
        0, tessera_metadata.slot_mapping, value[0].transpose(0, 1).to(v_cache.dtype)
    )
    output = torch.empty(
        query.shape[2], query.shape[1], query.shape[3], dtype=query.dtype, device=query.device
    )
    block_size = tessera_kv.block_size
    gqa = key.shape[1] != query.shape[1]
    prefill = zip(tessera_metadata.segments, tessera_metadata.block_tables, strict=True)
    for segment, table in prefill:
        q = query[:, :, segment.query_start : segment.query_end]
        num_context = segment.num_context
        if segment.num_past == 0 and key.dtype == k_cache.dtype:
            # A first chunk's context is its own new keys, the very values just stored.
            k = key[:, :, segment.query_start : segment.query_end]
            v = value[:, :, segment.query_start : segment.query_end]
        else:
            k = _gather_blocks(k_cache, block_size, table)
            v = _gather_blocks(v_cache, block_size, table)
        mask = _mask(segment, segment.num_new, sliding_window, q.device)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q,
            k[:, :, :num_context],
            v[:, :, :num_context],
            attn_mask=mask,
            is_causal=mask is None and segment.num_past == 0 and segment.num_new > 1,
            scale=scaling,
            enable_gqa=gqa,
        )
        output[segment.query_start : segment.query_end] = attended[0].transpose(0, 1)
    for batch in tessera_metadata.decodes:
        output[batch.query_indices] = _attend_decodes(
            batch, query, key, value, tessera_kv, layer, sliding_window, scaling
        )
    return output.unsqueeze(0), None


def _attend_decodes(
    batch: DecodeBatch,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    store: PagedKVStore,
    layer: int,
    sliding_window: int | None,
    scaling: float | None,
) -> torch.Tensor:
    """The batch's decode queries attended in one call -> `[B, heads, d]`: over the decode
    mirror's rows where the batch has them, else over contexts gathered from the store."""
    # [heads, T, d] -> the decode queries as a batch: [B, heads, 1, d]
    q = query[0].index_select(1, batch.query_indices).transpose(0, 1).unsqueeze(2)
    k_cache, v_cache = store.keys[layer], store.values[layer]
    if batch.mirror is not None and store.mirror is not None:
        keys, values = store.mirror.batch(
            layer,
            batch.mirror,
            k_cache,
            v_cache,
            key[0].index_select(1, batch.query_indices).transpose(0, 1),
            value[0].index_select(1, batch.query_indices).transpose(0, 1),
        )
    else:
        keys = _gather_blocks(k_cache, store.block_size, batch.block_tables)
        values = _gather_blocks(v_cache, store.block_size, batch.block_tables)
    attended = torch.nn.functional.scaled_dot_product_attention(
        q,
        keys,
        values,
        attn_mask=batch.mask(store.block_size, sliding_window),
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return attended[:, :, 0]


def _gather_blocks(
    cache: torch.Tensor, block_size: int, block_tables: torch.Tensor
) -> torch.Tensor:
    """`[B, max_blocks]` tables -> `[B, kv_heads, max_blocks * block_size, d]`: one copy
    of whole blocks (contiguous runs of `block_size` slots), not one index per slot."""
    num_tables, width = block_tables.shape
    blocks = cache.view(-1, block_size, *cache.shape[1:])
    gathered = blocks.index_select(0, block_tables.reshape(-1))
    return gathered.view(num_tables, width * block_size, *cache.shape[1:]).transpose(1, 2)


def _mask(
    segment: Segment, num_new: int, sliding_window: int | None, device: torch.device
) -> torch.Tensor | None:
    """`[num_new, num_past + num_new]` True where a query sees a key; None when plain
    causal attention (SDPA's `is_causal`, or no mask for one query) says it all."""
    last_position = segment.num_past + num_new - 1
    windowed = sliding_window is not None and last_position >= sliding_window
    if not windowed and not segment.bidirectional and (segment.num_past == 0 or num_new == 1):
        return None
    # Query i sits at position num_past + i and sees keys 0 ..= num_past + i.
    queries = torch.arange(num_new, device=device).unsqueeze(1) + segment.num_past
    keys = torch.arange(segment.num_past + num_new, device=device).unsqueeze(0)
    mask = keys <= queries
    for start, end in segment.bidirectional:
        mask |= (queries >= start) & (queries < end) & (keys >= start) & (keys < end)
    if windowed:
        mask &= keys > queries - sliding_window
    return mask


AttentionInterface.register(ATTENTION_NAME, paged_attention)
