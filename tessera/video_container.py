"""FFmpeg's side of `tessera.video`: opening only the accepted containers, reading the
video stream's header, counting its frames from packets, and decoding the sampled
frames. Every error FFmpeg or PyAV raises on a file becomes a VideoError."""

from __future__ import annotations

import contextlib
import io
import math
import time
from array import array
from collections.abc import Iterator

import numpy as np

from tessera.video import ACCEPTED_NAMES, VideoError, VideoInfo, VideoLimits

# FFmpeg's names of the demuxers accepted: MP4/MOV (and their 3GP kin), Matroska/WebM.
# The whitelist makes FFmpeg refuse any other format before its demuxer reads a byte
# past the probe; the names are checked again after opening.
FORMAT_WHITELIST = "mov,matroska"
ACCEPTED_CONTAINERS = frozenset({"mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm"})
# The decoders' own frame-size bound (FFmpeg's `max_pixels`), set so that a frame the
# header did not announce (a size change mid-stream) is refused before FFmpeg allocates
# it. Looser than the limit: decoders pad, and MPEG-4 Part 2 asks for 17x a 64 x 48
# frame's pixels. The exact limit is checked on the header and on every frame.
DECODER_PIXELS_FACTOR = 2
MIN_DECODER_PIXELS = 1 << 20
# A file whose frames cover less than this share of its declared duration was cut short.
MIN_DECLARED_SHARE = 0.9
# Headers round durations (Matroska to the millisecond) and may count the last frame's
# display time; the frame count is checked exactly.
DECLARED_SLACK_SECONDS = 1.0
# Frame rates outside this range are a broken or hostile header.
MIN_FPS, MAX_FPS = 1e-6, 1000.0


def probe(data: bytes, limits: VideoLimits, deadline: float) -> tuple[VideoInfo, np.ndarray]:
    """The stream's facts and its frames' presentation timestamps in order (int64, in
    the stream's time base; empty where a packet has none)."""
    with _opened(data, limits) as (container, stream):
        width, height = stream.codec_context.width, stream.codec_context.height
        if width < 1 or height < 1:  # FFmpeg gives none above its bounds, or none said
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
        declared = _declared_seconds(container, stream)
        if declared is not None and declared > limits.max_seconds + DECLARED_SLACK_SECONDS:
            raise _too_long(f"declares {declared:.1f} s", limits)
        num_frames, timestamps = _count_frames(container, stream, fps, limits, deadline)
        if timestamps.size and stream.time_base:
            last_start = float(timestamps[-1] * stream.time_base)
        else:
            last_start = (num_frames - 1) / fps
        if declared is not None and last_start + 1 / fps < declared * MIN_DECLARED_SHARE:
            raise VideoError(
                f"the video's frames end at {last_start + 1 / fps:.2f} s but it declares "
                f"{declared:.2f} s: it is truncated; send the whole file"
            )
        codec, demuxer = stream.codec_context.name, container.format.name
        return VideoInfo(width, height, fps, num_frames, codec, demuxer), timestamps


def decode_sampled(
    data: bytes,
    limits: VideoLimits,
    info: VideoInfo,
    timestamps: np.ndarray,
    indices: list[int],
    frames: np.ndarray,
    deadline: float,
) -> None:
    """Fills `frames` with the frames at `indices` (increasing), decoding the stream once
    in order up to the last of them. A sampled frame must carry the timestamp of the
    packet counted at its index: else a frame before it did not decode, and it is
    another frame than the one sampled."""
    slot, index = 0, -1
    with _opened(data, limits) as (container, stream):
        for index, frame in enumerate(container.decode(stream)):
            if (frame.width, frame.height) != (info.width, info.height):
                raise VideoError(
                    f"frame {index} is {frame.width}x{frame.height}, not the stream's "
                    f"{info.width}x{info.height}; send a video of one frame size"
                )
            if index == indices[slot]:
                if timestamps.size and frame.pts is not None and frame.pts != timestamps[index]:
                    raise _broken(f"frame {index} decodes as another frame", info)
                frames[slot] = frame.to_ndarray(format="rgb24")
                slot += 1
                if slot == len(indices):
                    return
            _check_deadline(deadline, limits)
    raise _broken(f"only {index + 1} of its frames decode", info)


@contextlib.contextmanager
def _opened(data: bytes, limits: VideoLimits) -> Iterator[tuple]:
    """The container and its first video stream (audio and other streams are ignored);
    closed on the way out."""
    import av

    decoder_pixels = max(DECODER_PIXELS_FACTOR * limits.max_frame_pixels, MIN_DECODER_PIXELS)
    try:
        container = av.open(
            io.BytesIO(data),
            mode="r",
            format=None,
            metadata_errors="ignore",
            container_options={"format_whitelist": FORMAT_WHITELIST},
            options={"max_pixels": str(decoder_pixels)},  # find_stream_info's decoders
        )
    except Exception as error:  # FFmpeg's many error kinds all mean "not usable"
        raise VideoError(
            f"video bytes could not be read as {ACCEPTED_NAMES} ({error}); send {ACCEPTED_NAMES}"
        ) from None
    try:
        if container.format.name not in ACCEPTED_CONTAINERS:
            raise VideoError(
                f"{container.format.name!r} is not an accepted container; send {ACCEPTED_NAMES}"
            )
        if not container.streams.video:
            raise VideoError(f"the file holds no video stream; send {ACCEPTED_NAMES}")
        stream = container.streams.video[0]
        if stream.codec_context is None:
            raise VideoError(
                "the video's codec is not one FFmpeg decodes; send H.264, HEVC, VP8, VP9, "
                "AV1 or MPEG-4 video"
            )
        stream.thread_type = "SLICE"  # deterministic output, frames in order
        stream.codec_context.options = {"max_pixels": str(decoder_pixels)}
        yield container, stream
    except VideoError:
        raise
    # FFmpeg and PyAV raise many kinds of errors on hostile files (FFmpegError and its
    # OSError/ValueError/MemoryError kin, PyAV's own); all of them mean "not usable".
    except Exception as error:
        raise VideoError(
            f"video bytes could not be decoded ({error}); send {ACCEPTED_NAMES} whose "
            f"frames are at most {limits.max_frame_pixels} pixels (--max-video-frame-pixels)"
        ) from None
    finally:
        container.close()


def _count_frames(
    container, stream, fps: float, limits: VideoLimits, deadline: float
) -> tuple[int, np.ndarray]:
    """The number of frames the stream shows, from its packets (not the empty ones that
    flush the demuxer, nor those an MP4 edit list hides: FFmpeg decodes and drops
    those), and their presentation timestamps, sorted (none if a packet has none)."""
    max_frames = math.floor(limits.max_seconds * fps + 1e-6)  # num_frames / fps <= limit
    timestamps: array[int] | None = array("q")
    num_frames = 0
    for packet in container.demux(stream):
        if packet.size and not packet.is_discard:
            num_frames += 1
            if num_frames > max_frames:
                seconds = f"{num_frames / fps:.1f} s or more ({num_frames} frame(s) at {fps:g} fps)"
                raise _too_long(f"runs {seconds}", limits)
            if packet.pts is None:
                timestamps = None
            elif timestamps is not None:
                timestamps.append(packet.pts)
        _check_deadline(deadline, limits)
    if num_frames == 0:
        raise VideoError(f"the video stream has no frames; send {ACCEPTED_NAMES}")
    if timestamps is None:
        return num_frames, np.zeros(0, np.int64)
    return num_frames, np.sort(np.frombuffer(timestamps, np.int64))


def _declared_seconds(container, stream) -> float | None:
    """The duration the header states: the video stream's, else the container's (which
    Matroska states for all its streams at once)."""
    if stream.duration is not None and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # AV_TIME_BASE
    return None


def _frame_rate(stream) -> float:
    rate = stream.average_rate or stream.base_rate or stream.guessed_rate
    fps = float(rate) if rate else 0.0
    if not MIN_FPS <= fps <= MAX_FPS:
        raise VideoError(f"the video's frame rate {fps:g} is not usable; send {ACCEPTED_NAMES}")
    return fps


def _broken(why: str, info: VideoInfo) -> VideoError:
    return VideoError(
        f"the video's stream holds {info.total_num_frames} frames but {why}: the file is "
        "broken, truncated or cut between keyframes; send the whole file, or re-encode it"
    )


def _too_long(why: str, limits: VideoLimits) -> VideoError:
    return VideoError(
        f"the video {why}, longer than the limit of {limits.max_seconds:g} s "
        "(--max-video-seconds); send a shorter clip"
    )


def _check_deadline(deadline: float, limits: VideoLimits) -> None:
    if time.monotonic() >= deadline:
        raise VideoError(
            f"the video took over {limits.max_decode_seconds:g} s to read and decode "
            "(--max-video-decode-seconds); send a shorter or smaller clip"
        )
