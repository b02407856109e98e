"""Conversions between protobuf messages and Tessera's domain objects, in one place."""

from __future__ import annotations

from tessera.placeholders import Modality, PlaceholderRange
from tessera.tensor_codec import RowBlock, check_block
from tessera.v1 import common_pb2

_MODALITY_TO_PROTO = {
    Modality.IMAGE: common_pb2.MODALITY_IMAGE,
    Modality.AUDIO: common_pb2.MODALITY_AUDIO,
}
_MODALITY_FROM_PROTO = {value: key for key, value in _MODALITY_TO_PROTO.items()}


def modality_to_proto(modality: Modality) -> int:
    return _MODALITY_TO_PROTO[modality]


def modality_from_proto(value: int) -> Modality:
    """Raises ValueError for MODALITY_UNSPECIFIED or an unknown number."""
    try:
        return _MODALITY_FROM_PROTO[value]
    except KeyError:
        raise ValueError(f"modality must be IMAGE or AUDIO, got {value}") from None


def range_to_proto(item: PlaceholderRange) -> common_pb2.PlaceholderRange:
    return common_pb2.PlaceholderRange(
        modality=modality_to_proto(item.modality),
        content_hash=item.content_hash,
        offset=item.offset,
        length=item.length,
    )


def range_from_proto(message: common_pb2.PlaceholderRange) -> PlaceholderRange:
    return PlaceholderRange(
        modality=modality_from_proto(message.modality),
        content_hash=message.content_hash,
        offset=message.offset,
        length=message.length,
    )


def media_item_to_proto(item: PlaceholderRange, data: bytes) -> common_pb2.MediaItem:
    """The item named by `item`'s content hash, with its encoded bytes."""
    return common_pb2.MediaItem(
        modality=modality_to_proto(item.modality), data=data, content_hash=item.content_hash
    )


def block_to_proto(block: RowBlock) -> common_pb2.TensorBytes:
    return common_pb2.TensorBytes(
        dtype=block.dtype, shape=[block.num_rows, block.hidden_size], data=block.data
    )


def block_from_proto(message: common_pb2.TensorBytes) -> RowBlock:
    """Raises tessera.tensor_codec.CodecError unless dtype, shape and bytes agree."""
    shape = list(message.shape)
    check_block(message.dtype, shape, len(message.data))
    return RowBlock(message.dtype, shape[0], shape[1], message.data)
