"""Which images the gateway sends to their encoder already processed.

The gateway decodes every image to hash it. An encoder that trusts the gateway's hashes
(mutual TLS: encoder_service/processed_pixels.py) can run its tower on the image
processor's output instead of decoding the file and processing it again, which for a
large picture is most of the encoder's work for it (a 1536 x 1536 PNG: ~30 ms to decode,
~20 ms to resize, against a few ms for a small tower). The pixel values travel in place
of the file; an encoder that does not trust this gateway refuses them and asks for the
file (gateway/encode_dispatch.py sends it then, and only files to that encoder after).

They are sent only where they are smaller than the decoded picture: a processor that
makes 224 x 224 float32 values (602 KB) from a 1536 x 1536 image (7 MB of pixels) saves
the encoder a large decode for fewer bytes than the picture; for a 200 x 200 image it
would send more bytes to save a decode of well under a millisecond.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from tessera.adapters import ModelFamily
from tessera.audio import DecodedAudio
from tessera.media import DecodedImage
from tessera.tensor_codec import PIXELS_DTYPE, itemsize
from tessera.video import DecodedVideo


def worth_sending(family: ModelFamily, media: DecodedImage | DecodedAudio | DecodedVideo) -> bool:
    """Whether the item is an image whose processed pixel values (the family's processor
    makes one fixed shape) are smaller than its decoded picture.

    Example: a 1536 x 1536 RGB image (7,077,888 bytes of pixels) for a processor making
    (3, 224, 224) (602,112 bytes) is sent processed; a 400 x 400 one (480,000) is not.
    """
    shape = family.processed_pixels_shape
    if shape is None or not isinstance(media, DecodedImage):
        return False
    picture_bytes = media.width * media.height * len(media.image.getbands())
    return math.prod(shape) * itemsize(PIXELS_DTYPE) < picture_bytes


class PixelValues:
    """Makes each item's content hash, and the pixel values of the images worth sending
    processed when `enabled` (the gateway has a certificate to be trusted by)."""

    def __init__(self, family: ModelFamily, enabled: bool):
        self.family = family
        self._hashing = ThreadPoolExecutor(1, thread_name_prefix="hash") if enabled else None

    def hash_and_pixels(
        self, media: DecodedImage | DecodedAudio | DecodedVideo, content_hash: Callable[[], str]
    ) -> tuple[str, torch.Tensor | None]:
        """`content_hash()`, and the image's pixel values or None."""
        if self._hashing is None or not worth_sending(self.family, media):
            return content_hash(), None
        # The hash on a thread beside the processor: both release the GIL, so on two
        # cores a 1536 px image takes ~47 ms for both instead of ~55.
        hashing = self._hashing.submit(content_hash)
        pixels = self.family.process_image(media)
        return hashing.result(), pixels
