"""Decoding a video into the frames its model family samples, under bounds a hostile
caller cannot escape.

Decoding uses PyAV (FFmpeg, shipped in its wheels); nothing here is a hand-written
codec. The steps, each refusing with a message that says what to fix:

1. open the bytes as one of the accepted containers (MP4/MOV, Matroska/WebM);
2. read the first video stream's header: frame size (refused above
   --max-video-frame-pixels before any frame is decoded) and frame rate;
3. count the stream's packets without decoding them (containers such as WebM store no
   frame count), refusing as soon as the count shows a clip over --max-video-seconds;
4. ask the family which frames it keeps (`FrameSampler`, the processor's own
   `sample_frames`), at most --max-video-frames, and check their bytes against
   MAX_SAMPLED_BYTES before decoding;
5. decode once, in order, converting only the sampled frames to RGB, under a wall-clock
   bound (--max-video-decode-seconds).

Memory stays bounded by the sampled frames (at most MAX_SAMPLED_BYTES) plus one decoded
frame; time by the demux pass and the decode bound.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.hashing import content_hash
from tessera.media import MediaError, ProcessingOptions
from tessera.placeholders import Modality

# FFmpeg's names of the demuxers accepted: MP4/MOV (and their 3GP kin), Matroska/WebM.
ACCEPTED_CONTAINERS = frozenset({"mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm"})
ACCEPTED_NAMES = "an MP4, WebM, MKV or MOV file"
# The decoded RGB bytes of one video's sampled frames: 256 frames of 1280 x 720.
MAX_SAMPLED_BYTES = 256 * 1280 * 720 * 3
# Videos a service decodes at once (each bounded by the limits); more wait their turn.
MAX_CONCURRENT_VIDEO_DECODES = 2
# A file whose frames cover less than this share of its declared duration was cut short.
MIN_DECLARED_SHARE = 0.9
# Frame rates outside this range are a broken or hostile header.
MIN_FPS, MAX_FPS = 1e-6, 1000.0


class VideoError(MediaError):
    """A video that cannot be used, with a message that says what to fix."""


@dataclass(frozen=True)
class VideoLimits:
    """What decoding one video may cost."""

    max_seconds: float = 600.0
    max_frames: int = 256
    max_frame_pixels: int = 3840 * 2160
    max_decode_seconds: float = 30.0


@dataclass(frozen=True)
class VideoInfo:
    """A video stream as its container describes it, before any frame is decoded."""

    width: int
    height: int
    fps: float
    total_num_frames: int
    container: str

    @property
    def duration_seconds(self) -> float:
        return self.total_num_frames / self.fps


# Which frames (indices into the stream, increasing) a family keeps of a video.
FrameSampler = Callable[[VideoInfo], Sequence[int]]


@dataclass(frozen=True, eq=False)
class DecodedVideo:
    """The sampled frames of a video, as every family and the content hash see them."""

    frames: np.ndarray  # [num_frames, height, width, 3] uint8 RGB
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
    if not data:
        raise VideoError(f"video part is empty; send the bytes of {ACCEPTED_NAMES}")
    deadline = time.monotonic() + limits.max_decode_seconds
    info = probe_video(data, limits, deadline)
    indices = _checked_indices(sampler(info), info, limits)
    return DecodedVideo(
        _decode_frames(data, info, indices, deadline),
        tuple(indices),
        info.fps,
        info.total_num_frames,
    )


def probe_video(data: bytes, limits: VideoLimits, deadline: float = math.inf) -> VideoInfo:
    """The stream's size, rate and frame count, without decoding a frame."""
    with _opened(data) as (container, stream):
        width, height = stream.codec_context.width, stream.codec_context.height
        if width < 1 or height < 1:  # FFmpeg gives none above 2^31 / 8 pixels, or none said
            raise VideoError(
                "the video's frames have no usable size; send a video of at most "
                f"{limits.max_frame_pixels} pixels per frame (--max-video-frame-pixels)"
            )
        if width * height > limits.max_frame_pixels:
            raise VideoError(
                f"video frames are {width}x{height} = {width * height} pixels, above the "
                f"limit of {limits.max_frame_pixels} (--max-video-frame-pixels); send a "
                "smaller video"
            )
        fps = _frame_rate(stream)
        max_frames = math.floor(limits.max_seconds * fps) + 1
        num_frames = 0
        for packet in container.demux(stream):
            if packet.size:
                num_frames += 1
            if num_frames > max_frames:
                raise VideoError(
                    f"the video is longer than {limits.max_seconds:g} s "
                    "(--max-video-seconds); send a shorter clip"
                )
            _check_deadline(deadline, limits)
        if num_frames == 0:
            raise VideoError(f"the video has no frames; send {ACCEPTED_NAMES}")
        _check_complete(container, stream, num_frames, fps)
        return VideoInfo(width, height, fps, num_frames, container.format.name)


def _checked_indices(indices: Sequence[int], info: VideoInfo, limits: VideoLimits) -> list[int]:
    indices = [int(i) for i in indices]
    if not indices or len(indices) > limits.max_frames:
        raise VideoError(
            f"{len(indices)} frames sampled; between 1 and {limits.max_frames} may be "
            "(--max-video-frames): lower fps or num_frames"
        )
    if indices != sorted(set(indices)) or indices[0] < 0 or indices[-1] >= info.total_num_frames:
        raise VideoError(f"frame indices {indices[:8]}... are not increasing within the video")
    num_bytes = len(indices) * info.width * info.height * 3
    if num_bytes > MAX_SAMPLED_BYTES:
        raise VideoError(
            f"{len(indices)} frames of {info.width}x{info.height} take {num_bytes} bytes, "
            f"above {MAX_SAMPLED_BYTES}; lower fps or num_frames, or send a smaller video"
        )
    return indices


def _decode_frames(data: bytes, info: VideoInfo, indices: list[int], deadline: float) -> np.ndarray:
    frames = np.empty((len(indices), info.height, info.width, 3), dtype=np.uint8)
    wanted = iter(enumerate(indices))
    slot, next_index = next(wanted)
    with _opened(data) as (container, stream):
        for index, frame in enumerate(container.decode(stream)):
            if index == next_index:
                if (frame.width, frame.height) != (info.width, info.height):
                    raise VideoError(
                        f"frame {index} is {frame.width}x{frame.height}, not the stream's "
                        f"{info.width}x{info.height}; send a video of one frame size"
                    )
                frames[slot] = frame.to_ndarray(format="rgb24")
                slot, next_index = next(wanted, (None, None))
                if slot is None:
                    break
            if time.monotonic() > deadline:
                raise VideoError(
                    "the video took too long to decode (--max-video-decode-seconds); send "
                    "a shorter or smaller clip"
                )
    if slot is not None:
        raise VideoError(
            f"the video stopped decoding before frame {next_index} of its "
            f"{info.total_num_frames}; it is truncated or corrupt: send the whole file"
        )
    return frames


class _opened:
    """The container and its first video stream; every FFmpeg error a VideoError."""

    def __init__(self, data: bytes):
        self._data = data
        self._container = None

    def __enter__(self):
        import av

        try:
            self._container = av.open(io.BytesIO(self._data), mode="r", metadata_errors="ignore")
        except Exception as error:  # FFmpeg's many error kinds all mean "not usable"
            raise VideoError(
                f"video bytes could not be read ({error}); send {ACCEPTED_NAMES}"
            ) from None
        container = self._container
        if container.format.name not in ACCEPTED_CONTAINERS:
            self._container.close()
            raise VideoError(
                f"{container.format.name!r} is not an accepted container; send {ACCEPTED_NAMES}"
            )
        if not container.streams.video:
            self._container.close()
            raise VideoError(f"the file holds no video stream; send {ACCEPTED_NAMES}")
        stream = container.streams.video[0]
        stream.thread_type = "SLICE"  # deterministic output, frames in order
        return container, stream

    def __exit__(self, kind, error, traceback) -> bool:
        self._container.close()
        if error is None or isinstance(error, VideoError):
            return False
        import av

        if isinstance(error, (av.FFmpegError, ValueError, OSError)):
            raise VideoError(
                f"video bytes could not be decoded ({error}); send {ACCEPTED_NAMES}"
            ) from None
        return False


def _check_complete(container, stream, num_frames: int, fps: float) -> None:
    """Refuses a file whose frames stop well before the duration its header declares
    (a download cut short): decoding it would silently give part of the video."""
    if stream.duration is not None and stream.time_base:
        declared = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        declared = container.duration / 1_000_000  # AV_TIME_BASE
    else:
        return
    if (num_frames + 1) / fps < declared * MIN_DECLARED_SHARE:
        raise VideoError(
            f"the video holds {num_frames / fps:.2f} s of frames but declares "
            f"{declared:.2f} s: it is truncated; send the whole file"
        )


def _frame_rate(stream) -> float:
    rate = stream.average_rate or stream.base_rate or stream.guessed_rate
    fps = float(rate) if rate else 0.0
    if not MIN_FPS <= fps <= MAX_FPS:
        raise VideoError(f"the video's frame rate {fps:g} is not usable; send {ACCEPTED_NAMES}")
    return fps


def _check_deadline(deadline: float, limits: VideoLimits) -> None:
    if time.monotonic() > deadline:
        raise VideoError(
            "the video took too long to read (--max-video-decode-seconds); send a shorter clip"
        )
