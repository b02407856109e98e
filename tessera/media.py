"""Decoding media bytes safely: size limits from the header, before pixels are decoded."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from PIL import Image

from tessera.hashing import content_hash
from tessera.placeholders import Modality

DEFAULT_MAX_IMAGE_PIXELS = 64_000_000
# The formats photos and screenshots come in. Others PIL can open (EPS through
# Ghostscript, PSD, ICO, ...) are refused from the header: each is more parser surface
# for a hostile file and none is what a chat client sends.
ALLOWED_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


class MediaError(ValueError):
    """Media that cannot be used, with a message that says what to fix."""


@dataclass(frozen=True)
class ProcessingOptions:
    """Processor settings that change an item's rows, as sorted (name, value) pairs:
    Qwen-VL's `min_pixels`/`max_pixels` (vLLM's `mm_processor_kwargs`), or a setting a
    family derives itself. Part of the content hash; travels with the item so every
    encoder processes it the same way."""

    values: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, mapping: Mapping[str, int]) -> ProcessingOptions:
        return cls(tuple(sorted((str(k), int(v)) for k, v in mapping.items())))

    def as_dict(self) -> dict[str, int]:
        return dict(self.values)

    def get(self, name: str, default: int | None = None) -> int | None:
        return self.as_dict().get(name, default)


def options_from_json(value: object) -> dict[str, int]:
    """Processing options from a decoded JSON object ({"max_pixels": 200704}); raises
    ValueError unless it maps names to integers (true/false count as 1/0)."""
    if not isinstance(value, dict):
        raise ValueError('must be an object of integer settings, e.g. {"max_pixels": 200704}')
    options = {}
    for name, setting in value.items():
        if isinstance(setting, bool):
            setting = int(setting)
        if not isinstance(setting, int) or not -(2**63) <= setting < 2**63:
            raise ValueError(f"{name} must be a 64-bit integer, got {setting!r}")
        options[name] = setting
    return options


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

    def content_hash(
        self, model_fingerprint: str, options: ProcessingOptions = ProcessingOptions()
    ) -> str:
        return content_hash(
            model_fingerprint,
            Modality.IMAGE.value,
            self.image.mode,
            (self.width, self.height),
            self.image.tobytes(),
            options.as_dict(),
        )


@contextlib.contextmanager
def _image_errors() -> Iterator[None]:
    """Turns whatever PIL raises on a file into a MediaError that says what to fix."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            yield
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise MediaError(f"image has too many pixels ({error}); send a smaller image") from None
    except Image.UnidentifiedImageError:
        accepted = ", ".join(ALLOWED_IMAGE_FORMATS)
        raise MediaError(
            f"image bytes could not be decoded as one of {accepted}; send one of those"
        ) from None
    # PIL raises many kinds of errors on hostile files; all of them mean "not usable".
    except Exception as error:
        raise MediaError(
            f"image bytes could not be decoded ({error}); send a valid image file"
        ) from None


def _open_header(data: bytes, max_pixels: int) -> Image.Image:
    """The image with only its header read; refuses a size above `max_pixels`."""
    if not data:
        raise MediaError("image part is empty; send the bytes of a PNG, JPEG or WebP file")
    image = Image.open(io.BytesIO(data), formats=ALLOWED_IMAGE_FORMATS)
    width, height = image.size
    if width * height > max_pixels:
        raise MediaError(
            f"image is {width}x{height} = {width * height} pixels, above the limit of "
            f"{max_pixels}; send a smaller image"
        )
    return image


def image_pixels(data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> int:
    """Width x height from the header alone (no pixel is decoded); raises MediaError as
    decode_image would for a file it cannot take."""
    with _image_errors():
        width, height = _open_header(data, max_pixels).size
    return width * height


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> DecodedImage:
    """Decodes encoded image bytes; refuses decompression bombs from the header alone.

    Animated formats contribute their first frame.
    """
    with _image_errors():
        image = _open_header(data, max_pixels)
        image.load()
        # Palette samples are only indices, and a transparency key (PNG tRNS) hides
        # pixels that the processor paints white: expand both, so that the samples the
        # content hash covers are the whole picture (two such images never share a key).
        if image.mode == "PA" or "transparency" in image.info:
            image = image.convert("RGBA")
        elif image.mode == "P":
            image = image.convert("RGB")
    return DecodedImage(image)
