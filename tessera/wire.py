"""Conversions between protobuf messages and Tessera's domain objects, in one place."""

from __future__ import annotations

import torch

from tessera.media import ProcessingOptions
from tessera.placeholders import ItemLayout, Modality, PlaceholderRange
from tessera.tensor_codec import PIXELS_DTYPE, RowBlock, check_block, encode_pixels
from tessera.v1 import common_pb2

_MODALITY_TO_PROTO = {
    Modality.IMAGE: common_pb2.MODALITY_IMAGE,
    Modality.AUDIO: common_pb2.MODALITY_AUDIO,
    Modality.VIDEO: common_pb2.MODALITY_VIDEO,
}
_MODALITY_FROM_PROTO = {value: key for key, value in _MODALITY_TO_PROTO.items()}
# Trailing metadata of an Encode refused because an item came as pixel values to an
# encoder that does not trust the caller's content hashes: send the files instead.
FILES_WANTED_KEY = "tessera-files-wanted"
# Seconds of video per temporal grid step: a frame every hour at temporal patch 2 is
# 7200; anything above (or NaN) is not a layout any processor makes.
MAX_SECOND_PER_GRID_T = 7200.0


def modality_to_proto(modality: Modality) -> int:
    return _MODALITY_TO_PROTO[modality]


def modality_from_proto(value: int) -> Modality:
    """Raises ValueError for MODALITY_UNSPECIFIED or an unknown number."""
    try:
        return _MODALITY_FROM_PROTO[value]
    except KeyError:
        raise ValueError(f"modality must be IMAGE, AUDIO or VIDEO, got {value}") from None


def layout_to_proto(layout: ItemLayout) -> common_pb2.ItemLayout:
    return common_pb2.ItemLayout(
        grid_thw=list(layout.grid_thw),
        spatial_merge_size=layout.spatial_merge_size,
        num_planes=layout.num_planes,
        second_per_grid_t=layout.second_per_grid_t,
    )


def layout_from_proto(message: common_pb2.ItemLayout) -> ItemLayout:
    """Raises ValueError for a grid that is not (t, h, w) of positive sizes, or a
    temporal spacing that is not a finite number >= 0."""
    grid = tuple(message.grid_thw)
    if grid and (len(grid) != 3 or min(grid) < 1):
        raise ValueError(f"layout grid_thw must be 3 positive sizes (t, h, w), got {list(grid)}")
    spacing = message.second_per_grid_t
    if not 0 <= spacing <= MAX_SECOND_PER_GRID_T:
        raise ValueError(
            f"layout second_per_grid_t must be in [0, {MAX_SECOND_PER_GRID_T}], got {spacing}"
        )
    return ItemLayout(grid, message.spatial_merge_size or 1, message.num_planes or 1, spacing)


def range_to_proto(item: PlaceholderRange) -> common_pb2.PlaceholderRange:
    return common_pb2.PlaceholderRange(
        modality=modality_to_proto(item.modality),
        content_hash=item.content_hash,
        offset=item.offset,
        length=item.length,
        layout=layout_to_proto(item.layout),
        row_start=item.row_start,
    )


def range_from_proto(message: common_pb2.PlaceholderRange) -> PlaceholderRange:
    return PlaceholderRange(
        modality=modality_from_proto(message.modality),
        content_hash=message.content_hash,
        offset=message.offset,
        length=message.length,
        layout=layout_from_proto(message.layout),
        row_start=message.row_start,
    )


def media_item_to_proto(
    item: PlaceholderRange,
    data: bytes,
    options: ProcessingOptions,
    cache_salt: str = "",
    pixel_values: torch.Tensor | None = None,
) -> common_pb2.MediaItem:
    """The item named by `item`'s (salted) content hash, with its encoded bytes, options
    and the salt its hash was made with; with an image's processed `pixel_values`, those
    in place of the bytes (common.proto says who takes them)."""
    message = common_pb2.MediaItem(
        modality=modality_to_proto(item.modality),
        data=data if pixel_values is None else b"",
        content_hash=item.content_hash,
        processing_options=options.as_dict(),
        cache_salt=cache_salt,
    )
    if pixel_values is not None:
        message.pixel_values.dtype = PIXELS_DTYPE
        message.pixel_values.shape[:] = pixel_values.shape
        message.pixel_values.data = encode_pixels(pixel_values)
    return message


def block_to_proto(block: RowBlock) -> common_pb2.TensorBytes:
    message = common_pb2.TensorBytes()
    fill_block_proto(message, block)
    return message


def fill_block_proto(message: common_pb2.TensorBytes, block: RowBlock) -> None:
    """Writes `block` into a TensorBytes field of a message being built. Cheaper than
    passing a built TensorBytes to the parent's constructor, which copies its bytes
    again (a 512 KiB block: ~10 us against ~80-500 us, mostly fresh pages)."""
    message.dtype = block.dtype
    message.shape[:] = [block.num_rows, block.hidden_size]
    # protobuf takes bytes only; bytes() of bytes is the same object, not a copy.
    message.data = block.data if type(block.data) is bytes else bytes(block.data)


def block_from_proto(message: common_pb2.TensorBytes) -> RowBlock:
    """Raises tessera.tensor_codec.CodecError unless dtype, shape and bytes agree."""
    shape = list(message.shape)
    data = message.data  # each read of a bytes field copies it: read it once
    check_block(message.dtype, shape, len(data))
    return RowBlock(message.dtype, shape[0], shape[1], data)
