"""Embedding rows <-> (dtype, shape, raw bytes) and <-> protobuf: exact round trips and
strict rejection of anything inconsistent (nothing is ever unpickled)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from tessera.tensor_codec import (
    CodecError,
    RowBlock,
    check_block,
    decode_rows,
    dtype_name,
    encode_rows,
    itemsize,
    parse_dtype,
)
from tessera.v1 import common_pb2, encoder_pb2
from tessera.wire import block_from_proto, block_to_proto, fill_block_proto

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def random_rows(dtype: torch.dtype, rows: int = 5, hidden: int = 7) -> torch.Tensor:
    values = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(0)) * 100
    values[0, :3] = torch.tensor([float("inf"), float("-inf"), -0.0])
    return values.to(dtype)


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and a.view(torch.uint8).equal(b.view(torch.uint8))
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_is_bit_exact(dtype):
    tensor = random_rows(dtype)
    block = encode_rows(tensor)
    assert (block.dtype, block.num_rows, block.hidden_size) == (dtype_name(dtype), 5, 7)
    assert len(block.data) == 5 * 7 * tensor.element_size()
    assert bit_equal(
        decode_rows(block.dtype, [block.num_rows, block.hidden_size], block.data), tensor
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_proto_round_trip_is_bit_exact(dtype):
    tensor = random_rows(dtype)
    message = common_pb2.TensorBytes.FromString(
        block_to_proto(encode_rows(tensor)).SerializeToString()
    )
    assert list(message.shape) == [5, 7]
    block = block_from_proto(message)
    assert bit_equal(
        decode_rows(block.dtype, [block.num_rows, block.hidden_size], block.data), tensor
    )


def test_nan_survives_bit_exact():
    tensor = torch.full((2, 3), float("nan"))
    block = encode_rows(tensor)
    assert bit_equal(decode_rows("float32", [2, 3], block.data), tensor)


def test_non_contiguous_tensor_encodes_its_values():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert not tensor.is_contiguous()
    block = encode_rows(tensor)
    assert decode_rows("float32", [4, 3], block.data).equal(tensor)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("start", "end"), [(0, 5), (0, 1), (2, 4), (4, 5)])
def test_rows_equal_the_tensor_row_slice(dtype, start, end):
    tensor = random_rows(dtype)
    part = encode_rows(tensor).rows(start, end)
    assert part.num_rows == end - start
    assert bit_equal(
        decode_rows(part.dtype, [part.num_rows, part.hidden_size], part.data), tensor[start:end]
    )


@pytest.mark.parametrize(("start", "end"), [(-1, 2), (3, 3), (4, 2), (0, 6), (5, 6)])
def test_rows_outside_the_block_rejected(start, end):
    with pytest.raises(CodecError, match="outside"):
        encode_rows(random_rows(torch.float32)).rows(start, end)


@pytest.mark.parametrize("num_bytes", [0, 1, 5 * 7 * 4 - 1, 5 * 7 * 4 + 1, 5 * 7 * 2])
def test_wrong_byte_count_rejected(num_bytes):
    with pytest.raises(CodecError, match="do not fit dtype float32 and shape"):
        decode_rows("float32", [5, 7], bytes(num_bytes))


@pytest.mark.parametrize("name", ["float64", "int8", "uint8", "", "Float32", "torch.float32"])
def test_unknown_dtype_rejected(name):
    with pytest.raises(CodecError, match="unsupported dtype"):
        decode_rows(name, [1, 1], bytes(8))
    with pytest.raises(CodecError, match="unsupported dtype"):
        parse_dtype(name)


def test_unsupported_tensor_dtype_rejected():
    with pytest.raises(CodecError, match="unsupported dtype"):
        encode_rows(torch.zeros(2, 2, dtype=torch.float64))


@pytest.mark.parametrize("shape", [[4], [2, 2, 1], [], [1, 2, 2]])
def test_shapes_other_than_2d_rejected(shape):
    numel = 1
    for size in shape:
        numel *= size
    with pytest.raises(CodecError, match="expected shape"):
        decode_rows("float32", shape, bytes(4 * numel))
    with pytest.raises(CodecError, match="expected a 2-D"):
        encode_rows(torch.zeros(shape))


@pytest.mark.parametrize("shape", [[0, 4], [4, 0], [0, 0], [-1, -4], [2, -2]])
def test_empty_or_negative_shapes_rejected(shape):
    with pytest.raises(CodecError, match="expected shape"):
        decode_rows("float32", shape, b"")
    with pytest.raises(CodecError, match="expected shape"):
        check_block("float32", shape, 16)


def test_arbitrary_bytes_of_the_wrong_length_rejected():
    """Pickled data is just bytes here: refused unless it happens to fit exactly, and then
    it is read as numbers, never executed."""
    payload = pickle.dumps(torch.zeros(2, 2))
    with pytest.raises(CodecError):
        decode_rows("float32", [2, 2], payload)
    buffer = io.BytesIO()
    torch.save(torch.zeros(2, 2), buffer)
    with pytest.raises(CodecError):
        decode_rows("float32", [2, 2], buffer.getvalue())


def test_fitting_bytes_are_read_as_raw_numbers():
    data = pickle.dumps("x").ljust(16, b"\x00")[:16]
    values = decode_rows("float32", [2, 2], data)
    assert values.dtype == torch.float32 and values.shape == (2, 2)


@pytest.mark.parametrize(
    ("dtype", "shape", "data"),
    [
        ("float32", [2, 3], bytes(23)),
        ("float64", [2, 3], bytes(48)),
        ("float32", [6], bytes(24)),
        ("float32", [1, 2, 3], bytes(24)),
        ("float32", [0, 3], b""),
        ("", [2, 3], bytes(24)),
    ],
)
def test_block_from_proto_rejects_inconsistent_messages(dtype, shape, data):
    with pytest.raises(CodecError):
        block_from_proto(common_pb2.TensorBytes(dtype=dtype, shape=shape, data=data))


def test_block_from_proto_keeps_fields():
    block = RowBlock("bfloat16", 3, 2, bytes(range(12)))
    assert block_from_proto(block_to_proto(block)) == block


def test_a_block_filled_into_a_message_being_built_is_the_same_message():
    """The encoder fills each slice message's rows in place (no second copy of the
    bytes); a reader must see exactly what the nested constructor would have sent."""
    block = RowBlock("float16", 3, 2, bytes(range(12)))
    built = encoder_pb2.EmbeddingSlice(content_hash="ab" * 32, start=7)
    fill_block_proto(built.rows, block)
    nested = encoder_pb2.EmbeddingSlice(
        content_hash="ab" * 32,
        start=7,
        rows=common_pb2.TensorBytes(dtype="float16", shape=[3, 2], data=bytes(range(12))),
    )
    assert built.SerializeToString() == nested.SerializeToString()
    fill_block_proto(built.rows, RowBlock("float32", 1, 1, bytes(4)))  # a refill replaces
    assert block_from_proto(built.rows) == RowBlock("float32", 1, 1, bytes(4))


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_itemsize_is_the_dtypes_element_size(name):
    assert itemsize(name) == torch.empty((), dtype=parse_dtype(name)).element_size()


@pytest.mark.parametrize("shape", [(0, 4), (4, 0)])
def test_empty_tensor_not_encoded(shape):
    """A block that no reader would accept is refused where it is made."""
    with pytest.raises(CodecError, match="expected a 2-D"):
        encode_rows(torch.zeros(shape))
