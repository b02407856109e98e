"""The decode batch's keys and values, kept contiguous from one step to the next.

A step attends its decode queries together over one padded `[B, kv_heads, keys, d]`
batch of their contexts. Gathered from the paged store, that batch is a copy of every
decoding request's whole context, per layer and per step: on the bench checkpoint at four
requests of ~500 tokens the gather cost as much as the attention itself (docs/
benchmarks.md). The mirror keeps the batch between steps instead, one row per decoding
request, and a step writes only its new token into each row, as the store's own write
does. A request joining the batch fills its row from the store once (one gather of its
blocks), a row whose request left is taken by another, and rows are kept packed at the
front so the batch stays a view: `[rows 0..B)`.

Two requests, block size 4, in rows 0 and 1 with 9 and 6 tokens mirrored: the next step
decodes both (positions 9 and 6) and the store's new keys go to `row 0 @ 9` and
`row 1 @ 6`. If request 0 then finishes and a request C of 11 tokens joins, C takes row 0
(its 3 blocks gathered once, 12 slots) and request 1 stays in row 1.

What it holds equals what a gather would read, bit for bit: a row is trusted only while
its request decodes in consecutive forwards with exactly the tokens the row holds. A
request that misses a forward (preempted, finished, waiting, prefilling again) loses its
row and is filled afresh when it decodes again, and a forward that raises empties the
mirror. Slots past a row's context hold zeros or an earlier request's keys (finite:
masked out, as the padding a gather reads).

Its memory is bounded (`max_bytes`, the decoder's `--decode-kv-mirror-bytes`): when a
step's batch does not fit, the rows that fit are mirrored (those it already holds first)
and the step gathers the rest, so the gain shrinks with load instead of vanishing.
Device-agnostic torch; the same on CUDA.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger("tessera.decoder")

# Keys per row are allocated in multiples of this, so that a growing context does not
# reallocate the mirror every block.
ROW_GROWTH_TOKENS = 256


@dataclass(frozen=True)
class Fill:
    """A row filled from the store: `blocks` (ids) hold the request's tokens so far."""

    row: int
    blocks: torch.Tensor


@dataclass(frozen=True)
class Move:
    """A kept row moved down to keep the batch's rows packed: tokens `[0, num_tokens)`."""

    from_row: int
    to_row: int
    num_tokens: int


@dataclass(frozen=True)
class MirrorStep:
    """What one forward does to the mirror: planned once, applied by every layer. The
    step's decode batch is rows `[0, num_rows)`, in row order."""

    num_rows: int
    width: int  # keys each row attends over (padded; the batch's mask says which count)
    order: tuple[int, ...]  # the planned decodes' indices, in row order
    moves: tuple[Move, ...]
    fills: tuple[Fill, ...]
    rows: torch.Tensor  # [num_rows] 0, 1, ...
    positions: torch.Tensor  # [num_rows] the position of each row's new token


@dataclass(frozen=True)
class _Row:
    index: int
    num_tokens: int  # tokens mirrored: positions [0, num_tokens)


class DecodeMirror:
    """Per layer, keys and values of `[rows, kv_heads, tokens, head_dim]`, grown as the
    batch needs within `max_bytes`."""

    def __init__(
        self,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        max_bytes: int,
    ):
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_bytes = max_bytes
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.bytes_per_token = 2 * num_layers * num_kv_heads * head_dim * itemsize
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._rows: dict[str, _Row] = {}  # request id -> its row, as of the last forward
        # Decode tokens attended over mirrored rows and over gathered contexts, so far.
        self.num_mirrored = 0
        self.num_gathered = 0

    @property
    def capacity(self) -> tuple[int, int]:
        """(rows, tokens per row) allocated."""
        return (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)

    def clear(self) -> None:
        """Forgets every row (the buffers stay allocated)."""
        self._rows = {}

    def plan(self, request_ids: Sequence[str], decodes: Sequence) -> MirrorStep | None:
        """The step for this forward's decode segments (`decodes[i]` is request
        `request_ids[i]`'s; each has `num_past` and `block_table`): the rows of the
        decodes it mirrors, or None when it mirrors none (requests not named uniquely,
        not one fits `max_bytes`, or the device is out of memory). Decodes the step
        leaves out are gathered. Called for every forward with decodes (one without
        clears the mirror): a request absent from a forward, or left out of it, loses
        its row."""
        previous, self._rows = self._rows, {}
        if not decodes or len(set(request_ids)) != len(decodes) or "" in request_ids:
            self.num_gathered += len(decodes)
            return None
        kept = {
            request_id: previous[request_id].index
            for request_id, segment in zip(request_ids, decodes, strict=True)
            if request_id in previous and previous[request_id].num_tokens == segment.num_past
        }
        chosen = self._choose(request_ids, decodes, kept)
        num_rows = len(chosen)
        width = max((len(decodes[i].block_table) for i in chosen), default=0) * self.block_size
        if not chosen or not self._reserve(num_rows, width):
            self.num_gathered += len(decodes)
            return None
        self.num_mirrored += num_rows
        self.num_gathered += len(decodes) - num_rows
        kept = {request_ids[i]: kept[request_ids[i]] for i in chosen if request_ids[i] in kept}
        free = sorted(set(range(num_rows)) - set(kept.values()))
        moves = []
        for request_id, index in kept.items():
            if index >= num_rows:  # keep the rows packed at the front
                kept[request_id] = free.pop(0)
                moves.append(Move(index, kept[request_id], previous[request_id].num_tokens))
        fills = []
        for i in chosen:
            if request_ids[i] not in kept:
                kept[request_ids[i]] = free.pop(0)
                num_blocks = -(-decodes[i].num_past // self.block_size)
                blocks = torch.tensor(decodes[i].block_table[:num_blocks], dtype=torch.long)
                fills.append(Fill(kept[request_ids[i]], blocks.to(self.device)))
        positions = [0] * num_rows
        order = [0] * num_rows
        for i in chosen:
            row = kept[request_ids[i]]
            positions[row] = decodes[i].num_past
            order[row] = i
            self._rows[request_ids[i]] = _Row(row, decodes[i].num_past + 1)
        return MirrorStep(
            num_rows,
            width,
            tuple(order),
            tuple(moves),
            tuple(fills),
            torch.arange(num_rows, device=self.device),
            torch.tensor(positions, dtype=torch.long, device=self.device),
        )

    def _choose(
        self, request_ids: Sequence[str], decodes: Sequence, kept: dict[str, int]
    ) -> list[int]:
        """Which decodes get rows when not all fit `max_bytes`: rows already holding their
        request first (a row filled again costs a gather), then the others in batch
        order, each taken if the rows chosen so far and it still fit. The rest are
        gathered, so a batch too large for the budget is mirrored in part, not dropped.

        Budget for 2 rows of 8 tokens, block size 4, kept: a (6 tokens), joining: b (14),
        c (5): a fits; a + b would need 2 rows of 16: left out; a + c fit -> [a, c]."""
        candidates = sorted(range(len(decodes)), key=lambda i: request_ids[i] not in kept)
        chosen: list[int] = []
        num_blocks = 0
        for i in candidates:
            wider = max(num_blocks, len(decodes[i].block_table))
            if self._shape(len(chosen) + 1, wider * self.block_size) is not None:
                chosen.append(i)
                num_blocks = wider
        return chosen

    def batch(
        self,
        layer: int,
        step: MirrorStep,
        store_keys: torch.Tensor,
        store_values: torch.Tensor,
        new_keys: torch.Tensor,
        new_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Applies `step` to `layer`'s rows, with the store's `[slots, kv_heads, d]`
        tensors and the step's new `[num_rows, kv_heads, d]` keys and values in row
        order; returns the batch's `[num_rows, kv_heads, width, d]` keys and values."""
        out = []
        for mirror, store, new in (
            (self.keys[layer], store_keys, new_keys),
            (self.values[layer], store_values, new_values),
        ):
            for move in step.moves:
                kept = mirror[move.from_row, :, : move.num_tokens]
                mirror[move.to_row, :, : move.num_tokens] = kept
            blocks = store.view(-1, self.block_size, *store.shape[1:])
            for fill in step.fills:
                num_tokens = len(fill.blocks) * self.block_size
                gathered = blocks.index_select(0, fill.blocks).view(num_tokens, *store.shape[1:])
                mirror[fill.row, :, :num_tokens] = gathered.transpose(0, 1)
            mirror[step.rows, :, step.positions] = new.to(mirror.dtype)
            out.append(mirror[: step.num_rows, :, : step.width])
        return out[0], out[1]

    def _shape(self, num_rows: int, width: int) -> tuple[int, int] | None:
        """(rows, tokens per row) to allocate for `num_rows` rows of `width` tokens: the
        current capacity where it holds them, else grown (tokens in steps of
        ROW_GROWTH_TOKENS where that fits `max_bytes`, else exactly); None when no shape
        fits `max_bytes`."""
        have_rows, have_tokens = self.capacity
        if num_rows <= have_rows and width <= have_tokens:
            return have_rows, have_tokens
        rows = max(num_rows, have_rows)
        for tokens in (-(-width // ROW_GROWTH_TOKENS) * ROW_GROWTH_TOKENS, width):
            tokens = max(tokens, have_tokens)
            if rows * tokens * self.bytes_per_token <= self.max_bytes:
                return rows, tokens
        return None

    def _reserve(self, num_rows: int, width: int) -> bool:
        """Makes room for `num_rows` rows of `width` tokens (a shape `_shape` allows),
        keeping what rows hold. False when the device is out of memory first (a mirror
        beside a KV cache sized to the last megabyte): the mirror then lets everything
        go and keeps to what it held before, and the step gathers."""
        rows, tokens = self._shape(num_rows, width)
        if (rows, tokens) == self.capacity:
            return True
        held_bytes = self.capacity[0] * self.capacity[1] * self.bytes_per_token
        try:
            self._grow((rows, self.num_kv_heads, tokens, self.head_dim))
        except RuntimeError as error:
            if not _out_of_memory(error):
                raise
            self.keys, self.values, self._rows = [], [], {}
            self.max_bytes = held_bytes
            log.warning(
                "decode mirror: no memory for %d rows of %d tokens (%s); its budget is now "
                "%d B, what it held; decode steps beyond it gather from the KV cache "
                "(--decode-kv-mirror-bytes sets it)",
                rows,
                tokens,
                str(error).splitlines()[0],
                held_bytes,
            )
            return False
        return True

    def _grow(self, shape: tuple[int, ...]) -> None:
        if not self.keys:
            self.keys = [self._zeros(shape) for _ in range(self.num_layers)]
            self.values = [self._zeros(shape) for _ in range(self.num_layers)]
            return
        # One layer at a time: at most the new size and one old layer are held at once.
        for tensors in (self.keys, self.values):
            for layer, old in enumerate(tensors):
                tensors[layer] = self._zeros(shape)
                tensors[layer][: old.shape[0], :, : old.shape[2]] = old

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        # Zeros, not empty memory: padding keys are masked out, but a NaN bit pattern
        # in a padding value would still reach the output (0 x NaN).
        return torch.zeros(shape, dtype=self.dtype, device=self.device)


def _out_of_memory(error: RuntimeError) -> bool:
    """torch.OutOfMemoryError on CUDA; on a CPU an allocator's plain RuntimeError."""
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)
