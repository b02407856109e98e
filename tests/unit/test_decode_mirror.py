"""The decode mirror gives the step's attention exactly (bit for bit) what a gather from
the paged store gives, while requests join, leave, skip a forward, outgrow its rows or
do not fit its memory; a forward that raises empties it.

The attention here runs on one torch thread. The mirror's rows reach SDPA as a strided
view (rows of its capacity, cut to the batch's width), a gather as a contiguous tensor,
and on an AMD EPYC host MKL's multithreaded products round such operands differently in
the last bit (6e-8 here; with MKL_CBWR=COMPATIBLE, or on one thread, not at all; on the
Intel hosts not at all). Equal bits on one thread say what this test is for: the mirror
holds the very keys and values a gather reads. The engine's tests check the tokens
against generate() on every thread."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import pytest
import torch

from decoder_service import decode_mirror
from decoder_service.model_runner import ModelRunner, WorkInput
from decoder_service.paged_attention import (
    AttentionMetadata,
    PagedKVStore,
    Segment,
    paged_attention,
)
from decoder_service.scheduler import ScheduledChunk

BLOCK_SIZE = 4
NUM_BLOCKS = 96
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8


@pytest.fixture(autouse=True)
def one_torch_thread():
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


class Layer(torch.nn.Module):
    layer_idx = 0


@dataclass
class Sequence:
    """One request's tokens so far: its blocks and how many positions are filled."""

    request_id: str
    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0


class Pair:
    """Two stores with the same contents, one with a mirror of `max_mirror_bytes`."""

    def __init__(self, max_mirror_bytes: int, seed: int = 0, sliding_window: int | None = None):
        self.sliding_window = sliding_window  # as a sliding-window layer passes it

        def store(mirror_bytes: int) -> PagedKVStore:
            return PagedKVStore(
                1,
                NUM_BLOCKS,
                BLOCK_SIZE,
                NUM_KV_HEADS,
                HEAD_DIM,
                torch.float32,
                torch.device("cpu"),
                mirror_bytes,
            )

        self.mirrored, self.gathered = store(max_mirror_bytes), store(0)
        self.generator = torch.Generator().manual_seed(seed)
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)  # no context is contiguous

    def step(self, decodes: list[Sequence], prefill: tuple[Sequence, int] | None = None):
        """One forward: a token for each of `decodes` (and `prefill`'s chunk of n new
        tokens first, when given). Returns both stores' outputs."""
        work = ([(prefill[0], prefill[1])] if prefill else []) + [(s, 1) for s in decodes]
        segments, slots, query_start = [], [], 0
        for sequence, num_new in work:
            end = sequence.num_tokens + num_new
            while len(sequence.blocks) * BLOCK_SIZE < end:
                sequence.blocks.append(self.free.pop())
            slots.append(
                self.gathered.slots(sequence.blocks, sequence.num_tokens, end, torch.device("cpu"))
            )
            segments.append(
                Segment(
                    query_start,
                    query_start + num_new,
                    sequence.num_tokens,
                    tuple(sequence.blocks),
                    request_id=sequence.request_id,
                )
            )
            sequence.num_tokens = end
            query_start += num_new
        query = torch.randn(1, NUM_HEADS, query_start, HEAD_DIM, generator=self.generator)
        keys = torch.randn(1, NUM_KV_HEADS, query_start, HEAD_DIM, generator=self.generator)
        values = torch.randn(1, NUM_KV_HEADS, query_start, HEAD_DIM, generator=self.generator)
        mirrored = AttentionMetadata.plan(torch.cat(slots), segments, self.mirrored.mirror)
        # The same batches, each gathered: what the mirror must give, bit for bit. (A
        # batch of other members pads to another width, which moves SDPA's last bits.)
        gathered = replace(
            mirrored, decodes=tuple(replace(b, mirror=None) for b in mirrored.decodes)
        )
        if len(mirrored.decodes) < 2:  # one batch: as the plain plan makes it
            gathered = AttentionMetadata.plan(torch.cat(slots), segments)
        outputs = []
        for store, metadata in ((self.mirrored, mirrored), (self.gathered, gathered)):
            output, _ = paged_attention(
                Layer(),
                query,
                keys,
                values,
                None,
                tessera_metadata=metadata,
                tessera_kv=store,
                sliding_window=self.sliding_window,
            )
            outputs.append(output)
        return outputs

    def recompute(self, sequence: Sequence) -> None:
        """New values for the sequence's keys and values in both stores."""
        slots = self.gathered.slots(sequence.blocks, 0, sequence.num_tokens, torch.device("cpu"))
        shape = (len(slots), NUM_KV_HEADS, HEAD_DIM)
        keys, values = (torch.randn(shape, generator=self.generator) for _ in range(2))
        for store in (self.mirrored, self.gathered):
            store.keys[0][slots] = keys
            store.values[0][slots] = values

    def check(self, decodes: list[Sequence], prefill=None, mirrored: str | None = None) -> None:
        """Both stores attend alike; the mirror holds rows for `mirrored` (request ids;
        default: every decode)."""
        counts = self.mirrored.mirror.num_mirrored, self.mirrored.mirror.num_gathered
        mirror, gather = self.step(decodes, prefill)
        assert torch.equal(mirror, gather)
        rows = self.mirrored.mirror._rows
        expected = set(mirrored if mirrored is not None else (s.request_id for s in decodes))
        assert set(rows) == expected
        counted = (
            self.mirrored.mirror.num_mirrored - counts[0],
            self.mirrored.mirror.num_gathered - counts[1],
        )
        assert counted == (len(expected), len(decodes) - len(expected))


def test_joining_leaving_and_packing_rows_gives_what_a_gather_gives(monkeypatch):
    monkeypatch.setattr(decode_mirror, "ROW_GROWTH_TOKENS", 8)  # grown often here
    pair = Pair(1 << 20)
    a, b, c, d, e = (Sequence(n) for n in "abcde")
    pair.step([], (a, 9))
    pair.step([], (b, 6))
    pair.step([], (c, 14))
    pair.check([a, b])  # every row filled from the store
    pair.check([a, b, c])  # one more row: the rows grow, keeping what a's and b's hold
    pair.check([a, b, c])  # a token each
    pair.step([], (d, 3))  # a forward without decodes: every row forgotten
    pair.check([a, b, c])
    pair.check([b, c, d])  # a left, d takes its row
    assert pair.mirrored.mirror._rows["d"].index == 0
    pair.check([c, d])  # b left: c moves down to keep the rows packed
    assert {r.index for r in pair.mirrored.mirror._rows.values()} == {0, 1}
    pair.check([d, c], (e, 5))  # a prefill chunk beside the decodes, order swapped
    pair.check([c, d, e])
    grown = pair.mirrored.mirror.capacity[1]
    for _ in range(12):  # c outgrows the rows allocated: they grow, keeping what they hold
        pair.check([c, d, e])
    assert pair.mirrored.mirror.capacity[1] > grown


def test_a_request_that_skips_a_forward_is_filled_again():
    pair = Pair(1 << 20)
    a, b = Sequence("a"), Sequence("b")
    pair.step([], (a, 7))
    pair.step([], (b, 5))
    pair.check([a, b])
    pair.check([b])  # a skips a forward: preempted, and its keys computed again ...
    pair.recompute(a)  # (a chunking of its own: values that differ in the last bits)
    pair.check([a, b])  # ... so its row is not trusted: filled from the store again


def test_a_forward_without_decodes_forgets_every_row():
    pair = Pair(1 << 20)
    a, b, c = Sequence("a"), Sequence("b"), Sequence("c")
    pair.step([], (a, 7))
    pair.step([], (b, 5))
    pair.check([a, b])
    pair.step([], (c, 4))  # every request was preempted; this forward only prefills ...
    assert pair.mirrored.mirror._rows == {}
    pair.recompute(a)  # ... and a's keys, computed again, differ in the last bits
    pair.recompute(b)
    pair.check([a, b])  # so both rows are filled from the store again


def budget(num_rows: int, num_tokens: int) -> int:
    """The mirror's bytes for rows of tokens (one layer)."""
    return num_rows * num_tokens * 2 * NUM_KV_HEADS * HEAD_DIM * 4


@pytest.mark.parametrize("sliding_window", [None, 5])
def test_a_batch_larger_than_the_budget_is_mirrored_in_part(monkeypatch, sliding_window):
    """Also on a sliding-window layer: each of the two batches masks its own keys."""
    monkeypatch.setattr(decode_mirror, "ROW_GROWTH_TOKENS", 8)
    # Room for 2 rows of 8 tokens (2 blocks): three requests of 4 to 7 tokens do not fit.
    pair = Pair(budget(2, 8), sliding_window=sliding_window)
    a, b, c = (Sequence(n) for n in "abc")
    for sequence in (a, b, c):
        pair.step([], (sequence, 3))
    pair.check([a, b])
    pair.check([c, a, b], mirrored="ab")  # the rows it holds stay; c is gathered
    pair.check([a, b, c], mirrored="ab")
    pair.check([b, c])  # a left: c gets its row


def test_a_wide_request_is_left_out_while_narrower_ones_fit(monkeypatch):
    monkeypatch.setattr(decode_mirror, "ROW_GROWTH_TOKENS", 8)
    pair = Pair(budget(2, 8))
    a, b, c = Sequence("a"), Sequence("b"), Sequence("c")
    pair.step([], (a, 5))
    pair.step([], (b, 13))  # 14 tokens at its decode: 4 blocks, wider than a row may be
    pair.step([], (c, 4))
    pair.check([a])
    pair.check([a, b, c], mirrored="ac")  # a and b would need 2 rows of 16
    pair.check([b], mirrored="")  # alone still too wide: gathered, every row forgotten
    pair.check([a, c])


def test_a_device_out_of_memory_lowers_the_budget_and_the_step_gathers(monkeypatch, caplog):
    """A device that has less memory than the budget says (a KV cache sized to the last
    megabyte): growing the rows fails, the step gathers, and the mirror keeps to what
    it held before instead of failing every request of the step."""
    monkeypatch.setattr(decode_mirror, "ROW_GROWTH_TOKENS", 8)
    zeros = decode_mirror.DecodeMirror._zeros

    def device_zeros(self, shape):  # this device holds no more than 2 rows of 8 tokens
        if shape[0] * shape[2] > 2 * 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return zeros(self, shape)

    monkeypatch.setattr(decode_mirror.DecodeMirror, "_zeros", device_zeros)
    pair = Pair(1 << 20)
    a, b, c = (Sequence(n) for n in "abc")
    for sequence in (a, b, c):
        pair.step([], (sequence, 3))
    pair.check([a, b])
    pair.check([a, b, c], mirrored="")  # 3 rows: no memory; every row let go
    assert "no memory for 3 rows of 8 tokens" in caplog.text
    assert pair.mirrored.mirror.max_bytes == budget(2, 8)
    assert pair.mirrored.mirror.capacity == (0, 0)
    pair.check([a, b, c], mirrored="ab")  # within what it held: mirrored again, in part


def test_an_error_other_than_memory_is_not_taken_for_one(monkeypatch):
    def broken_zeros(self, shape):
        raise RuntimeError("a bug in the mirror")

    monkeypatch.setattr(decode_mirror.DecodeMirror, "_zeros", broken_zeros)
    pair = Pair(1 << 20)
    a = Sequence("a")
    pair.step([], (a, 3))
    with pytest.raises(RuntimeError, match="a bug in the mirror"):
        pair.step([a])
    assert pair.mirrored.mirror.max_bytes == 1 << 20


def test_requests_without_names_are_gathered():
    pair = Pair(1 << 20)
    a, b = Sequence(""), Sequence("")
    pair.step([], (a, 4))
    pair.step([], (b, 4))
    pair.check([a, b], mirrored="")


class Raising:
    """A family whose forward fails after the step is planned (a layer raising)."""

    device = torch.device("cpu")
    hidden_size = 8
    num_planes = 1
    attention = type("Attention", (), {"bidirectional_items": False})()

    def embed_tokens(self, token_ids):
        return torch.zeros(len(token_ids), self.hidden_size)

    def positions(self, num_prompt_tokens, items, start, end):
        return torch.arange(start, end)

    def forward(self, *args, **kwargs):
        raise RuntimeError("a layer failed")


def test_a_forward_that_raises_empties_the_mirror():
    pair = Pair(1 << 20)
    a = Sequence("a")
    pair.step([], (a, 6))
    pair.check([a])
    table = (*a.blocks, pair.free.pop())
    chunk = ScheduledChunk("a", a.num_tokens, a.num_tokens + 1, (5,), 6, (), table, True)
    with pytest.raises(RuntimeError, match="a layer failed"):
        ModelRunner(Raising(), pair.mirrored).run([WorkInput(chunk, ())])
    assert pair.mirrored.mirror._rows == {}
