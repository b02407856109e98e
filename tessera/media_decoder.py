"""One place that turns an item's bytes into what its family encodes, under the limits
the operator set: the gateway (to count rows and hash) and the encoder (to encode and
check the hash) decode the same bytes the same way, so both see one content hash."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from tessera.audio import DEFAULT_MAX_AUDIO_SECONDS, DecodedAudio, decode_audio
from tessera.media import DEFAULT_MAX_IMAGE_PIXELS, DecodedImage, decode_image
from tessera.placeholders import Modality


@dataclass(frozen=True)
class MediaLimits:
    """Per-item bounds on what decoding may cost."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MediaLimits:
        return cls(args.max_image_pixels, args.max_audio_seconds)


def add_media_limit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="larger images are refused from their header, before decoding",
    )
    parser.add_argument(
        "--max-audio-seconds",
        type=float,
        default=DEFAULT_MAX_AUDIO_SECONDS,
        help="longer audio clips are refused (and never above what the model takes per item)",
    )


class MediaDecoder:
    """Decodes items for one family: images as they are, audio resampled to the family's
    rate and capped at the lower of the operator's limit and the family's own."""

    def __init__(
        self,
        limits: MediaLimits,
        audio_sampling_rate: int | None,
        family_max_audio_seconds: float | None = None,
    ):
        self.limits = limits
        self.audio_sampling_rate = audio_sampling_rate
        self.max_audio_seconds = min(limits.max_audio_seconds, family_max_audio_seconds or math.inf)

    @classmethod
    def for_family(cls, family: object, limits: MediaLimits) -> MediaDecoder:
        return cls(
            limits,
            getattr(family, "audio_sampling_rate", None),
            getattr(family, "max_audio_seconds", None),
        )

    def decode(self, modality: Modality, data: bytes) -> DecodedImage | DecodedAudio:
        """Raises ValueError (MediaError, AudioError) naming what to fix."""
        if modality == Modality.AUDIO:
            if self.audio_sampling_rate is None:
                raise ValueError("this model takes no audio")
            return decode_audio(data, self.audio_sampling_rate, self.max_audio_seconds)
        return decode_image(data, self.limits.max_image_pixels)
