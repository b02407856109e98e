"""A fetch's row messages land in one buffer at their offsets, and only a stream of
exactly the rows asked for (in order, one dtype, the decoder's width) becomes rows: one
slice's (RowAssembler, GetEmbeddingSlices) or a batch of slices' (BatchAssembler,
GetEmbeddingRows)."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from decoder_service.row_assembly import (
    HUGE_PAGE_BYTES,
    BatchAssembler,
    RecycledBuffers,
    RowAssembler,
    SliceStreamError,
    empty_bytes,
)
from tessera.row_stream import encode_rows_message
from tessera.tensor_codec import dtype_name, encode_rows
from tessera.v1 import encoder_pb2
from tessera.wire import fill_block_proto

HASH = "ab" * 32
WIDTH = 6


def rows_of(num_rows: int, dtype: torch.dtype = torch.float32, width: int = WIDTH) -> torch.Tensor:
    """Distinct finite values, so that a row in the wrong place shows."""
    return torch.arange(num_rows * width, dtype=torch.float32).view(num_rows, width).to(dtype)


def message(rows: torch.Tensor, start: int, content_hash: str = HASH) -> encoder_pb2.EmbeddingSlice:
    """What an encoder sends for `rows`, the item's rows from `start` on."""
    out = encoder_pb2.EmbeddingSlice(content_hash=content_hash, start=start)
    fill_block_proto(out.rows, encode_rows(rows))
    return out


def split(rows: torch.Tensor, first_row: int, sizes: list[int]) -> list[encoder_pb2.EmbeddingSlice]:
    assert sum(sizes) == rows.shape[0]
    messages, at = [], 0
    for size in sizes:
        messages.append(message(rows[at : at + size], first_row + at))
        at += size
    return messages


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sizes", [[16], [1, 15], [5, 1, 7, 3], [1] * 16])
def test_messages_of_any_sizes_assemble_to_exactly_the_rows(dtype, sizes):
    item = rows_of(40, dtype)
    wanted = item[10:26]
    assembler = RowAssembler(HASH, 10, 26, WIDTH)
    added = [assembler.add(m) for m in split(wanted, 10, sizes)]
    rows = assembler.finish()
    assert rows.dtype == dtype and rows.shape == (16, WIDTH)
    assert torch.equal(rows, wanted)
    itemsize = wanted.element_size()
    assert added == [size * WIDTH * itemsize for size in sizes]
    assert assembler.num_bytes == 16 * WIDTH * itemsize


def test_the_rows_do_not_share_memory_with_the_messages():
    item = rows_of(4)
    sent = message(item, 0)
    assembler = RowAssembler(HASH, 0, 4, WIDTH)
    assembler.add(sent)
    rows = assembler.finish()
    rows.zero_()  # the decoder may write in place; neither the message nor item change
    assert sent.rows.data == encode_rows(item).data


def test_a_short_stream_is_refused_at_the_end():
    assembler = RowAssembler(HASH, 0, 8, WIDTH)
    for m in split(rows_of(5), 0, [3, 2]):
        assembler.add(m)
    with pytest.raises(SliceStreamError, match=r"rows \[0, 5\) .* expected up to 8"):
        assembler.finish()


def test_an_empty_stream_is_refused():
    with pytest.raises(SliceStreamError, match=r"rows \[2, 2\) .* expected up to 4"):
        RowAssembler(HASH, 2, 4, WIDTH).finish()


def test_a_message_past_the_last_row_asked_for_is_refused():
    assembler = RowAssembler(HASH, 0, 4, WIDTH)
    with pytest.raises(SliceStreamError, match="below row 4"):
        assembler.add(message(rows_of(5), 0))


def test_a_message_after_the_stream_is_complete_is_refused():
    assembler = RowAssembler(HASH, 0, 4, WIDTH)
    assembler.add(message(rows_of(4), 0))
    with pytest.raises(SliceStreamError, match="below row 4"):
        assembler.add(message(rows_of(1), 4))


def test_a_message_of_another_width_is_refused():
    assembler = RowAssembler(HASH, 0, 4, WIDTH)
    assembler.add(message(rows_of(2), 0))
    with pytest.raises(SliceStreamError, match=r"\[2, 7\] block at row 2; expected rows 6 wide"):
        assembler.add(message(rows_of(2, width=WIDTH + 1), 2))


def test_a_change_of_dtype_midstream_is_refused():
    # float16 rows of width 6 take the bytes of float32 rows of width 3: only the dtype
    # tells them apart.
    assembler = RowAssembler(HASH, 0, 4, WIDTH)
    assembler.add(message(rows_of(2, torch.float32), 0))
    with pytest.raises(SliceStreamError, match="float16 rows at row 2 after float32"):
        assembler.add(message(rows_of(2, torch.float16), 2))


@pytest.mark.parametrize(("start", "content_hash"), [(1, HASH), (3, HASH), (2, "cd" * 32)])
def test_rows_out_of_place_or_of_another_item_are_refused(start, content_hash):
    assembler = RowAssembler(HASH, 0, 6, WIDTH)
    assembler.add(message(rows_of(2), 0))
    with pytest.raises(SliceStreamError, match=rf"expected {HASH} from 2"):
        assembler.add(message(rows_of(2), start, content_hash))


def test_bytes_that_do_not_fit_the_stated_shape_are_refused():
    bad = message(rows_of(2), 0)
    bad.rows.data = bad.rows.data[:-1]
    with pytest.raises(SliceStreamError, match="malformed embedding slice"):
        RowAssembler(HASH, 0, 2, WIDTH).add(bad)


def test_a_refused_message_leaves_the_rows_received_so_far_unchanged():
    assembler = RowAssembler(HASH, 0, 4, WIDTH)
    assembler.add(message(rows_of(2), 0))
    with pytest.raises(SliceStreamError):
        assembler.add(message(rows_of(2, width=WIDTH + 1), 2))
    assert (assembler.next_row, assembler.num_bytes) == (2, 2 * WIDTH * 4)


def test_an_empty_range_is_a_programming_error():
    with pytest.raises(ValueError):
        RowAssembler(HASH, 3, 3, WIDTH)


# GetEmbeddingRows: several slices' rows back to back, in messages that ignore slice
# boundaries, into one buffer.

SLICES = [(HASH, 10, 26), ("cd" * 32, 0, 3), (HASH, 30, 31), ("ef" * 32, 5, 25)]
NUM_ROWS = sum(end - start for _, start, end in SLICES)  # 40


def rows_message(rows: torch.Tensor, first_row: int, width: int | None = None) -> bytes:
    """What an encoder sends: `rows`, the call's rows from `first_row` on."""
    data = encode_rows(rows).data
    return encode_rows_message(first_row, dtype_name(rows.dtype), width or rows.shape[1], [data])


def batch_messages(rows: torch.Tensor, sizes: list[int]) -> list[bytes]:
    assert sum(sizes) == rows.shape[0]
    out, at = [], 0
    for size in sizes:
        out.append(rows_message(rows[at : at + size], at))
        at += size
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sizes", [[40], [16, 24], [1, 15, 3, 1, 20], [7] * 5 + [5], [1] * 40])
def test_a_batchs_messages_of_any_sizes_become_each_slices_exact_rows(dtype, sizes):
    sent = rows_of(NUM_ROWS, dtype)
    assembler = BatchAssembler(SLICES, WIDTH)
    added = [assembler.add(m) for m in batch_messages(sent, sizes)]
    parts = assembler.finish()
    itemsize = sent.element_size()
    assert added == [size * WIDTH * itemsize for size in sizes]
    assert assembler.num_bytes == NUM_ROWS * WIDTH * itemsize
    at = 0
    for (_, start, end), part in zip(SLICES, parts, strict=True):
        assert part.dtype == dtype and part.shape == (end - start, WIDTH)
        assert torch.equal(part, sent[at : at + end - start])
        at += end - start


def test_a_large_batchs_rows_outlive_the_assembler_and_are_writable():
    """From HUGE_PAGE_BYTES on the buffer is a private mapping of its own (for huge
    pages), which the rows keep alive: valid and writable once the assembler is gone."""
    width = 1024
    num_rows = HUGE_PAGE_BYTES // (width * 4) + 3
    sent = torch.arange(num_rows * width, dtype=torch.float32).view(num_rows, width)
    assembler = BatchAssembler([(HASH, 0, num_rows)], width)
    assembler.add(rows_message(sent, 0))
    (part,) = assembler.finish()
    del assembler
    gc.collect()
    assert torch.equal(part, sent)
    part.add_(1)
    assert torch.equal(part, sent + 1)
    assert empty_bytes(HUGE_PAGE_BYTES).numel() == HUGE_PAGE_BYTES


def test_a_short_batch_is_refused_at_the_end():
    assembler = BatchAssembler(SLICES, WIDTH)
    for m in batch_messages(rows_of(39), [20, 19]):
        assembler.add(m)
    with pytest.raises(SliceStreamError, match="sent 39 of the 40 rows"):
        assembler.finish()
    with pytest.raises(SliceStreamError, match="sent 0 of the 40 rows"):
        BatchAssembler(SLICES, WIDTH).finish()


@pytest.mark.parametrize(
    ("first_row", "num_rows", "reason"),
    [
        (0, 41, r"rows \[0, 41\) of the call; expected from row 0 and below row 40"),
        (1, 2, r"rows \[1, 3\) of the call; expected from row 0"),
    ],
)
def test_rows_out_of_place_or_past_the_end_are_refused(first_row, num_rows, reason):
    with pytest.raises(SliceStreamError, match=reason):
        BatchAssembler(SLICES, WIDTH).add(rows_message(rows_of(num_rows), first_row))


def test_rows_after_the_batch_is_complete_are_refused():
    assembler = BatchAssembler(SLICES, WIDTH)
    assembler.add(rows_message(rows_of(40), 0))
    with pytest.raises(SliceStreamError, match=r"rows \[40, 41\)"):
        assembler.add(rows_message(rows_of(1), 40))


def test_rows_of_another_width_or_partial_rows_are_refused():
    assembler = BatchAssembler(SLICES, WIDTH)
    with pytest.raises(SliceStreamError, match="rows 7 wide; expected whole rows 6 wide"):
        assembler.add(rows_message(rows_of(2, width=WIDTH + 1), 0))
    # The width the message states is right, its bytes are not whole rows of it.
    data = encode_rows(rows_of(2)).data[:-4]
    with pytest.raises(SliceStreamError, match="expected whole rows"):
        assembler.add(encode_rows_message(0, "float32", WIDTH, [data]))
    with pytest.raises(SliceStreamError, match="0 bytes"):
        assembler.add(encode_rows_message(0, "float32", WIDTH, [b""]))
    assert (assembler.next_row, assembler.num_bytes) == (0, 0)


def test_a_change_of_dtype_or_an_unknown_dtype_is_refused():
    assembler = BatchAssembler(SLICES, WIDTH)
    assembler.add(rows_message(rows_of(2, torch.float32), 0))
    with pytest.raises(SliceStreamError, match="float16 rows at row 2 after float32"):
        assembler.add(rows_message(rows_of(2, torch.float16), 2))
    with pytest.raises(SliceStreamError, match="unsupported dtype"):
        BatchAssembler(SLICES, WIDTH).add(encode_rows_message(0, "int8", WIDTH, [bytes(6)]))
    assert assembler.next_row == 2


def test_bytes_that_are_not_a_message_are_refused():
    with pytest.raises(SliceStreamError, match="malformed embedding rows: no data field"):
        BatchAssembler(SLICES, WIDTH).add(b"\x08\x01")


def test_the_batch_rows_do_not_share_memory_with_the_messages():
    sent = rows_message(rows_of(40), 0)
    kept = bytes(sent)
    assembler = BatchAssembler(SLICES, WIDTH)
    assembler.add(sent)
    for part in assembler.finish():
        part.zero_()
    assert sent == kept


def test_a_batch_without_slices_is_a_programming_error():
    with pytest.raises(ValueError):
        BatchAssembler([], WIDTH)
    with pytest.raises(ValueError):
        BatchAssembler([(HASH, 3, 3)], WIDTH)


def test_a_large_buffer_is_used_again_only_once_every_view_of_it_is_gone():
    pool = RecycledBuffers(16 * HUGE_PAGE_BYTES)
    first = pool.take(3 * HUGE_PAGE_BYTES)
    rows = first.view(torch.float32)[10:20]  # a view, as FetchedRows.rows are
    del first
    second = pool.take(3 * HUGE_PAGE_BYTES)  # the first's rows are alive: a new mapping
    assert second.data_ptr() != rows.data_ptr() - 40
    assert pool.num_reused == 0 and pool.num_bytes == 6 * HUGE_PAGE_BYTES
    rows.fill_(7)
    second.fill_(1)
    assert (rows == 7).all()
    del rows
    gc.collect()
    third = pool.take(2 * HUGE_PAGE_BYTES + 1)  # fits the first mapping, now free
    assert pool.num_reused == 1 and pool.num_bytes == 6 * HUGE_PAGE_BYTES
    assert third.numel() == 2 * HUGE_PAGE_BYTES + 1
    assert pool.take(HUGE_PAGE_BYTES).numel() == HUGE_PAGE_BYTES  # 3x too big to reuse
    assert pool.num_reused == 1


def test_the_pool_keeps_at_most_its_bytes_dropping_idle_mappings_first():
    pool = RecycledBuffers(4 * HUGE_PAGE_BYTES)
    busy = pool.take(2 * HUGE_PAGE_BYTES)
    pool.take(2 * HUGE_PAGE_BYTES)  # freed at once: idle
    assert pool.num_bytes == 4 * HUGE_PAGE_BYTES
    other = pool.take(HUGE_PAGE_BYTES - 1)  # the idle mapping is more than twice that
    assert pool.num_reused == 0
    assert pool.num_bytes == 3 * HUGE_PAGE_BYTES  # the new one replaced the idle one
    beyond = pool.take(3 * HUGE_PAGE_BYTES)  # every kept mapping busy, no room: not kept
    assert pool.num_bytes == 3 * HUGE_PAGE_BYTES
    for tensor in (busy, other, beyond):
        tensor.fill_(3)  # all usable, none overlapping another
    assert (busy == 3).all() and (other == 3).all() and (beyond == 3).all()
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel()) for t in (busy, other, beyond))
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
