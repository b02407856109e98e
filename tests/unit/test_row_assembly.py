"""A fetch's row messages land in one buffer at their offsets, and only a stream of
exactly the rows asked for (in order, one dtype, the decoder's width) becomes rows."""

from __future__ import annotations

import pytest
import torch

from decoder_service.row_assembly import RowAssembler, SliceStreamError
from tessera.tensor_codec import encode_rows
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
