"""Decoding a video into the frames its model family samples, under bounds a hostile
caller cannot escape.

Decoding uses PyAV (FFmpeg, shipped in its wheels; `tessera.video_container` holds
everything that touches it); nothing here is a hand-written codec. The steps, each
refusing with a message that says what to fix:

1. open the bytes as one of the accepted containers (MP4/MOV, Matroska/WebM): FFmpeg's
   other demuxers never parse them;
2. read the first video stream's header: codec, frame size (refused above
   --max-video-frame-pixels before any frame is decoded), frame rate and declared
   duration (refused above --max-video-seconds);
3. count the frames the stream shows from its packets, without decoding them
   (containers such as WebM store no frame count; packets an MP4 edit list hides are
   not counted), refusing as soon as the count shows a clip over --max-video-seconds;
4. ask the family which frames it keeps (`FrameSampler`, the processor's own
   `sample_frames`), at most --max-video-frames, and check their RGB bytes against
   `VideoLimits.max_sampled_bytes` before decoding;
5. decode once, in order, converting only the sampled frames to RGB and stopping after
   the last, under a wall-clock bound (--max-video-decode-seconds). Every frame must
   have the header's size. A stream that decodes to fewer frames than it counted (a
   cut that starts between keyframes, a broken file) is refused when a sampled frame
   is missing: the frames are never silently taken from elsewhere.

Memory stays bounded by the sampled frames (at most `max_sampled_bytes`) plus what the
decoder holds (its own frame-size bound is set from --max-video-frame-pixels); time by
the demux pass and the decode bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.hashing import content_hash
from tessera.media import MediaError, ProcessingOptions
from tessera.placeholders import Modality

ACCEPTED_NAMES = "an MP4, WebM, MKV or MOV file"
# The decoded RGB bytes of one video's sampled frames: 256 frames of 1280 x 720
# (675 MiB). --max-video-frames times --max-video-frame-pixels would allow 6 GiB; a
# longer or larger clip must be sampled more sparsely.
MAX_SAMPLED_BYTES = 256 * 1280 * 720 * 3
# Videos a service decodes at once (each bounded by the limits); more wait their turn.
MAX_CONCURRENT_VIDEO_DECODES = 2


class VideoError(MediaError):
    """A video that cannot be used, with a message that says what to fix."""


@dataclass(frozen=True)
class VideoLimits:
    """What decoding one video may cost."""

    max_seconds: float = 600.0  # --max-video-seconds
    max_frames: int = 256  # --max-video-frames: sampled frames per video
    max_frame_pixels: int = 3840 * 2160  # --max-video-frame-pixels
    max_decode_seconds: float = 30.0  # --max-video-decode-seconds: demux + decode
    max_sampled_bytes: int = MAX_SAMPLED_BYTES  # RGB bytes of the sampled frames


@dataclass(frozen=True)
class VideoInfo:
    """A video stream as its container describes it, before any frame is decoded."""

    width: int
    height: int
    fps: float  # the stream's average frame rate
    total_num_frames: int  # counted from the stream's packets
    codec: str  # FFmpeg's decoder name: "h264", "vp9", ...
    container: str  # FFmpeg's demuxer name: "mov,mp4,m4a,3gp,3g2,mj2" or "matroska,webm"

    @property
    def duration_seconds(self) -> float:
        return self.total_num_frames / self.fps


# Which frames (indices into the stream, increasing) a family keeps of a video. It may
# raise ValueError naming what to fix (too short a clip for the model, ...).
FrameSampler = Callable[[VideoInfo], Sequence[int]]


def uniform_sampler(num_frames: int) -> FrameSampler:
    """`num_frames` evenly spaced frames, index floor(i * total / num_frames) for i in
    0..num_frames-1 (torch.arange(0, total, total / num).int() without float rounding);
    a clip of fewer frames gives all of them."""
    if num_frames < 1:
        raise ValueError(f"num_frames must be at least 1, got {num_frames}")

    def sample(info: VideoInfo) -> list[int]:
        count = min(num_frames, info.total_num_frames)
        return [i * info.total_num_frames // count for i in range(count)]

    return sample


@dataclass(frozen=True, eq=False)
class DecodedVideo:
    """The sampled frames of a video, as every family and the content hash see them."""

    frames: np.ndarray  # [num_frames, height, width, 3] uint8 RGB, read-only
    frame_indices: tuple[int, ...]  # each frame's index in the stream
    fps: float  # the stream's frame rate
    total_num_frames: int

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    def timestamps(self) -> tuple[float, ...]:
        return tuple(index / self.fps for index in self.frame_indices)

    def metadata(self):  # -> transformers.video_utils.VideoMetadata
        """The processors' description of the frames (Qwen3-VL writes their timestamps
        into the prompt; Qwen2.5-VL spaces positions by the sampled frame rate)."""
        from transformers.video_utils import VideoMetadata

        return VideoMetadata(
            total_num_frames=self.total_num_frames,
            fps=self.fps,
            width=self.width,
            height=self.height,
            duration=self.total_num_frames / self.fps,
            video_backend="pyav",
            frames_indices=list(self.frame_indices),
        )

    def content_hash(self, model_fingerprint: str, options: ProcessingOptions | None = None) -> str:
        """Over the sampled frames, where they sit in the stream and its rate (the
        timestamps a family may write), and the options: another sampling of the same
        file is another entry, the same frames the same one whatever the container."""
        mode = f"rgb24 fps={self.fps.hex()} of={self.total_num_frames} at={self.frame_indices}"
        return content_hash(
            model_fingerprint,
            Modality.VIDEO.value,
            mode,
            self.frames.shape,
            self.frames.data,
            options.as_dict() if options is not None else {},
        )


def decode_video(data: bytes, limits: VideoLimits, sampler: FrameSampler) -> DecodedVideo:
    """Encoded video bytes -> the frames `sampler` keeps; raises VideoError (or the
    sampler's ValueError) naming what to fix."""
    from tessera import video_container

    if not data:
        raise VideoError(f"video part is empty; send the bytes of {ACCEPTED_NAMES}")
    deadline = time.monotonic() + limits.max_decode_seconds
    info, timestamps = video_container.probe(data, limits, deadline)
    indices = _checked_indices(sampler(info), info, limits)
    frames = np.empty((len(indices), info.height, info.width, 3), dtype=np.uint8)
    video_container.decode_sampled(data, limits, info, timestamps, indices, frames, deadline)
    frames.flags.writeable = False  # the content hash names these bytes
    return DecodedVideo(frames, tuple(indices), info.fps, info.total_num_frames)


def probe_video(data: bytes, limits: VideoLimits, deadline: float | None = None) -> VideoInfo:
    """The stream's codec, size, rate and frame count, without decoding a frame.
    `deadline`: a time.monotonic() bound (default: --max-video-decode-seconds from now)."""
    from tessera import video_container

    if not data:
        raise VideoError(f"video part is empty; send the bytes of {ACCEPTED_NAMES}")
    if deadline is None:
        deadline = time.monotonic() + limits.max_decode_seconds
    return video_container.probe(data, limits, deadline)[0]


def _checked_indices(indices: Sequence[int], info: VideoInfo, limits: VideoLimits) -> list[int]:
    indices = [int(i) for i in indices]
    if not indices or len(indices) > limits.max_frames:
        raise VideoError(
            f"{len(indices)} frames sampled; between 1 and {limits.max_frames} may be "
            "(--max-video-frames): lower fps or num_frames"
        )
    if indices != sorted(set(indices)) or indices[0] < 0 or indices[-1] >= info.total_num_frames:
        raise VideoError(
            f"sampled frame indices {indices[:8]}... are not increasing within the "
            f"video's {info.total_num_frames} frames"
        )
    num_bytes = len(indices) * info.width * info.height * 3
    if num_bytes > limits.max_sampled_bytes:
        raise VideoError(
            f"{len(indices)} frames of {info.width}x{info.height} take {num_bytes} bytes "
            f"as RGB, above the limit of {limits.max_sampled_bytes}; lower fps or "
            "num_frames, or send a smaller video"
        )
    return indices
