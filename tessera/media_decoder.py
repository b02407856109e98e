"""One place that turns an item's bytes into what its family encodes, under the limits
the operator set: the gateway (to count rows and hash) and the encoder (to encode and
check the hash) decode the same bytes the same way, so both see one content hash."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tessera.audio import DEFAULT_MAX_AUDIO_SECONDS, DecodedAudio, decode_audio
from tessera.media import (
    DEFAULT_MAX_IMAGE_PIXELS,
    DecodedImage,
    MediaError,
    ProcessingOptions,
    decode_image,
    image_pixels,
)
from tessera.placeholders import Modality
from tessera.video import DecodedVideo, FrameSampler, VideoLimits, decode_video

# A family's `video_sampler`: which frames to keep under an item's options, at most so many.
VideoSamplerFactory = Callable[[ProcessingOptions, int], FrameSampler]

# Two images of the largest size: what one request (or one Encode call) may make a
# service decode. 16 such images took an encoder 15 s and 2 GB before this bound.
DEFAULT_MAX_REQUEST_PIXELS = 2 * DEFAULT_MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on what decoding may cost, per item and per request."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_audio_seconds: float = DEFAULT_MAX_AUDIO_SECONDS
    max_request_pixels: int = DEFAULT_MAX_REQUEST_PIXELS
    video: VideoLimits = field(default_factory=VideoLimits)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MediaLimits:
        video = VideoLimits(
            max_seconds=args.max_video_seconds,
            max_frames=args.max_video_frames,
            max_frame_pixels=args.max_video_frame_pixels,
            max_decode_seconds=args.max_video_decode_seconds,
        )
        return cls(args.max_image_pixels, args.max_audio_seconds, args.max_request_pixels, video)


def add_media_limit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-image-pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="larger images are refused from their header, before decoding",
    )
    parser.add_argument(
        "--max-request-pixels",
        type=int,
        default=DEFAULT_MAX_REQUEST_PIXELS,
        help="most image pixels in one request (or one Encode call), summed from the "
        "headers before any image is decoded",
    )
    parser.add_argument(
        "--max-audio-seconds",
        type=float,
        default=DEFAULT_MAX_AUDIO_SECONDS,
        help="longer audio clips are refused (and never above what the model takes per item)",
    )
    video = VideoLimits()
    parser.add_argument(
        "--max-video-seconds",
        type=float,
        default=video.max_seconds,
        help="longer videos are refused from their container, before any frame is decoded",
    )
    parser.add_argument(
        "--max-video-frames",
        type=int,
        default=video.max_frames,
        help="most frames sampled from one video (a long clip is sampled more sparsely; "
        "a request for more is refused)",
    )
    parser.add_argument(
        "--max-video-frame-pixels",
        type=int,
        default=video.max_frame_pixels,
        help="videos with larger frames are refused from the stream header",
    )
    parser.add_argument(
        "--max-video-decode-seconds",
        type=float,
        default=video.max_decode_seconds,
        help="a video taking longer to decode is refused",
    )


class MediaDecoder:
    """Decodes items for one family: images as they are, audio resampled to the family's
    rate and capped at the lower of the operator's limit and the family's own."""

    def __init__(
        self,
        limits: MediaLimits,
        audio_sampling_rate: int | None,
        family_max_audio_seconds: float | None = None,
        video_sampler: VideoSamplerFactory | None = None,
    ):
        self.limits = limits
        self.audio_sampling_rate = audio_sampling_rate
        self.max_audio_seconds = min(limits.max_audio_seconds, family_max_audio_seconds or math.inf)
        self.video_sampler = video_sampler

    @classmethod
    def for_family(cls, family: object, limits: MediaLimits) -> MediaDecoder:
        return cls(
            limits,
            getattr(family, "audio_sampling_rate", None),
            getattr(family, "max_audio_seconds", None),
            getattr(family, "video_sampler", None),
        )

    def decode(
        self, modality: Modality, data: bytes, options: ProcessingOptions | None = None
    ) -> DecodedImage | DecodedAudio | DecodedVideo:
        """Raises ValueError (MediaError, AudioError, VideoError) naming what to fix.
        `options`: the item's, which say how a video's frames are sampled."""
        if modality == Modality.AUDIO:
            if self.audio_sampling_rate is None:
                raise ValueError("this model takes no audio")
            return decode_audio(data, self.audio_sampling_rate, self.max_audio_seconds)
        if modality == Modality.VIDEO:
            if self.video_sampler is None:
                raise ValueError("this model takes no video")
            sampler = self.video_sampler(
                options or ProcessingOptions(), self.limits.video.max_frames
            )
            return decode_video(data, self.limits.video, sampler)
        return decode_image(data, self.limits.max_image_pixels)

    def pixels(self, modality: Modality, data: bytes) -> int:
        """An image's pixels from its header (0 for audio, or bytes no image header
        reads: decoding refuses those with the reason)."""
        if modality != Modality.IMAGE:
            return 0
        try:
            return image_pixels(data, self.limits.max_image_pixels)
        except MediaError:
            return 0

    def check_request_pixels(self, items: Iterable[tuple[Modality, bytes]]) -> None:
        """Refuses a request whose images add up to more than --max-request-pixels, from
        their headers, before any is decoded. Raises MediaError."""
        total = sum(self.pixels(modality, data) for modality, data in items)
        if total > self.limits.max_request_pixels:
            raise MediaError(
                f"the request's images have {total} pixels in all, above the limit of "
                f"{self.limits.max_request_pixels} (--max-request-pixels); send fewer or "
                "smaller images"
            )
