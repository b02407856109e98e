"""The paged attention of a packed step equals plain attention over each request's own
contiguous context: decode queries attended together (one padded batch) and prefill
chunks one by one, with blocks scattered over the store, GQA, and sliding windows."""

from __future__ import annotations

import pytest
import torch

from decoder_service.paged_attention import (
    AttentionMetadata,
    PagedKVStore,
    Segment,
    paged_attention,
)

BLOCK_SIZE = 4
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8


class Layer(torch.nn.Module):
    layer_idx = 0


def expected(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, num_past: int, window
) -> torch.Tensor:
    """`[heads, n, d]` queries at positions num_past.. over `[kv, num_past + n, d]`."""
    num_new, num_keys = query.shape[1], keys.shape[1]
    positions = torch.arange(num_new).unsqueeze(1) + num_past
    key_positions = torch.arange(num_keys).unsqueeze(0)
    mask = key_positions <= positions
    if window is not None:
        mask &= key_positions > positions - window
    repeat = NUM_HEADS // NUM_KV_HEADS
    return torch.nn.functional.scaled_dot_product_attention(
        query.unsqueeze(0),
        keys.repeat_interleave(repeat, 0).unsqueeze(0),
        values.repeat_interleave(repeat, 0).unsqueeze(0),
        attn_mask=mask,
    )[0]


@pytest.mark.parametrize("window", [None, 3, 6])
def test_a_step_of_decodes_and_a_chunk_equals_attention_over_each_context(window):
    generator = torch.Generator().manual_seed(0)
    store = PagedKVStore(1, 32, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    # (tokens before this step, new tokens): three decodes of different lengths, a prefill
    # chunk between them and a first chunk (its context is its own new keys); blocks
    # handed out shuffled, so no context is contiguous.
    shapes = [(9, 1), (2, 1), (5, 6), (0, 7), (13, 1)]
    free = torch.randperm(32, generator=generator).tolist()
    contexts, segments, slot_mappings = [], [], []
    query_start = 0
    for num_past, num_new in shapes:
        total = num_past + num_new
        table = [free.pop() for _ in range(-(-total // BLOCK_SIZE))]
        keys = torch.randn(NUM_KV_HEADS, total, HEAD_DIM, generator=generator)
        values = torch.randn(NUM_KV_HEADS, total, HEAD_DIM, generator=generator)
        past_slots = store.slots(table, 0, num_past, torch.device("cpu"))
        store.keys[0][past_slots] = keys[:, :num_past].transpose(0, 1)
        store.values[0][past_slots] = values[:, :num_past].transpose(0, 1)
        slot_mappings.append(store.slots(table, num_past, total, torch.device("cpu")))
        segments.append(Segment(query_start, query_start + num_new, num_past, tuple(table)))
        contexts.append((keys, values))
        query_start += num_new
    metadata = AttentionMetadata.plan(torch.cat(slot_mappings), segments)
    assert [len(batch.query_indices) for batch in metadata.decodes] == [3]  # one batch
    assert len(metadata.segments) == 2

    query = torch.randn(1, NUM_HEADS, query_start, HEAD_DIM, generator=generator)
    new_keys = torch.cat([k[:, p:] for (k, _), (p, _) in zip(contexts, shapes, strict=True)], dim=1)
    new_values = torch.cat(
        [v[:, p:] for (_, v), (p, _) in zip(contexts, shapes, strict=True)], dim=1
    )
    output, _ = paged_attention(
        Layer(),
        query,
        new_keys.unsqueeze(0),
        new_values.unsqueeze(0),
        None,
        tessera_metadata=metadata,
        tessera_kv=store,
        sliding_window=window,
    )
    for segment, (keys, values) in zip(segments, contexts, strict=True):
        got = output[0, segment.query_start : segment.query_end].transpose(0, 1)
        want = expected(
            query[0, :, segment.query_start : segment.query_end],
            keys,
            values,
            segment.num_past,
            window,
        )
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
