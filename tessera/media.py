"""Decoding media bytes safely: size limits from the header, before pixels are decoded."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

from tessera.hashing import content_hash
from tessera.placeholders import Modality

DEFAULT_MAX_IMAGE_PIXELS = 64_000_000


class MediaError(ValueError):
    """Media that cannot be used, with a message that says what to fix."""


@dataclass(frozen=True)
class DecodedImage:
    """An image decoded to pixels, as every model family and the content hash see it."""

    image: Image.Image

    @property
    def width(self) -> int:
        return self.image.width

    @property
    def height(self) -> int:
        return self.image.height

    def content_hash(self, model_fingerprint: str) -> str:
        return content_hash(
            model_fingerprint,
            Modality.IMAGE.value,
            self.image.mode,
            (self.width, self.height),
            self.image.tobytes(),
        )


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> DecodedImage:
    """Decodes encoded image bytes; refuses decompression bombs from the header alone.

    Animated formats contribute their first frame.
    """
    if not data:
        raise MediaError("image part is empty; send the bytes of a PNG, JPEG or WebP file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise MediaError(
                    f"image is {width}x{height} = {width * height} pixels, above the limit of "
                    f"{max_pixels}; send a smaller image"
                )
            image.load()
            # Palette samples are only indices, and a transparency key (PNG tRNS) hides
            # pixels that the processor paints white: expand both, so that the samples the
            # content hash covers are the whole picture (two such images never share a key).
            if image.mode == "PA" or "transparency" in image.info:
                image = image.convert("RGBA")
            elif image.mode == "P":
                image = image.convert("RGB")
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise MediaError(f"image has too many pixels ({error}); send a smaller image") from None
    # PIL raises many kinds of errors on hostile files; all of them mean "not usable".
    except Exception as error:
        raise MediaError(
            f"image bytes could not be decoded ({error}); send a valid image file"
        ) from None
    return DecodedImage(image)
