"""The engine's own attention for packed forwards over a paged KV cache.

One forward carries every scheduled request's tokens back to back (batch of one). The
language model computes Q, K, V and RoPE as usual; this function, registered with
transformers' AttentionInterface, writes each new token's K/V into its slot of the
paged store, then attends each request's queries to its own context (gathered through
its block table) with a causal offset: a query at position p sees keys at positions <= p.

Two rules widen or narrow that, as the model's own mask does (Gemma 3):
- inside a bidirectional item `[s, e)` a query sees every key of the item;
- a sliding-window layer (the model passes `sliding_window=W`) hides keys at or before
  `p - W`, applied after the item rule: AND(window, OR(causal, same item)).

Everything here is device-agnostic torch; the same code runs on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import AttentionInterface

ATTENTION_NAME = "tessera_paged"


@dataclass(frozen=True)
class Segment:
    """One request's part of a packed forward."""

    query_start: int  # packed index of its first new token
    query_end: int
    num_past: int  # tokens already in its KV cache before this step
    context_slots: torch.Tensor  # [num_past + num_new] slots of its whole context, in order
    # Position ranges [start, end) of items whose tokens see each other both ways.
    bidirectional: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_packed_tokens] slot each new token's K/V goes to
    segments: tuple[Segment, ...]


class PagedKVStore:
    """Per-layer K and V tensors of `[num_blocks * block_size, num_kv_heads, head_dim]`."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        shape = (num_blocks * block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

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
    for segment in tessera_metadata.segments:
        q = query[:, :, segment.query_start : segment.query_end]
        k = k_cache.index_select(0, segment.context_slots).transpose(0, 1).unsqueeze(0)
        v = v_cache.index_select(0, segment.context_slots).transpose(0, 1).unsqueeze(0)
        num_new = segment.query_end - segment.query_start
        mask = _mask(segment, num_new, sliding_window, q.device)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None and segment.num_past == 0 and num_new > 1,
            scale=scaling,
            enable_gqa=k.shape[1] != q.shape[1],
        )
        output[segment.query_start : segment.query_end] = attended[0].transpose(0, 1)
    return output.unsqueeze(0), None


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
