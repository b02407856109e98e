"""Pixel values a gateway processed, used only from a caller trusted with content hashes.

A gateway decodes every image anyway, to hash it. Where the model's image processor makes
every image one fixed shape and that is smaller than the decoded picture (a 1536 px photo
for a 336 px tower: 1.4 MB of float32 against 7 MB of pixels), the gateway sends the
processor's output in place of the file (`MediaItem.pixel_values`), and an encoder that
trusts its hashes runs the tower on them instead of decoding the file a second time and
processing it again. The rows are filed under the caller's content hash unchecked, which
is what trusting a caller's hashes already means (hash_trust.py, docs/security.md). So
from anyone else pixel values are not used: beside a file they are ignored (and counted)
and the file is decoded and its hash checked as always; in place of one, the Encode is
refused with FAILED_PRECONDITION and trailing metadata that asks for the files (a
gateway that was not told it is not trusted then sends them, and keeps sending them to
that encoder).
"""

from __future__ import annotations

import logging

import torch

from encoder_service.items import EncoderCounters, InvalidItemError
from tessera.tensor_codec import CodecError, decode_pixels
from tessera.v1 import common_pb2

log = logging.getLogger("tessera.encoder")


class FilesWantedError(InvalidItemError):
    """Pixel values in place of a file from a caller not trusted with content hashes."""


def pixels_of(
    item: common_pb2.MediaItem,
    trusted: bool,
    expected_shape: tuple[int, ...] | None,
    counters: EncoderCounters,
) -> torch.Tensor | None:
    """The pixel values to encode `item` from, or None to decode its file. Raises
    FilesWantedError for pixel values without a file from a caller not `trusted`, and
    InvalidItemError for pixel values a trusted caller cannot have meant: on audio or
    video, for a model whose processor has no fixed shape, of another shape or dtype."""
    if not item.HasField("pixel_values"):
        return None
    if not trusted and not item.data:
        raise FilesWantedError(
            f"item {item.content_hash}: this encoder takes pixel values only from callers "
            "it trusts with content hashes (--trust-content-hashes-from, mutual TLS); "
            "send the file"
        )
    if not trusted:
        if not counters.num_pixel_values_ignored:
            log.warning(
                "pixel values from a caller not trusted with content hashes are ignored "
                "(its files are decoded instead); does --trust-content-hashes-from name "
                "the gateway's certificate?"
            )
        counters.num_pixel_values_ignored += 1
        return None
    if item.modality != common_pb2.MODALITY_IMAGE:
        raise InvalidItemError("pixel_values are for images only; send the file alone")
    if expected_shape is None:
        raise InvalidItemError(
            "this model's image processor makes no fixed shape, so the encoder processes "
            "each image itself; send the file alone"
        )
    pixels = item.pixel_values
    try:
        return decode_pixels(pixels.dtype, pixels.shape, pixels.data, expected_shape)
    except CodecError as error:
        raise InvalidItemError(f"item {item.content_hash}: {error}") from None
