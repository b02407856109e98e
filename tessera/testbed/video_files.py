"""Test videos encoded by PyAV in memory: seeded, different in every frame, in the
containers users send (MP4 and MOV with H.264, WebM with VP9, Matroska with MPEG-4, and
Matroska with lossless FFV1), and the bad inputs the services must refuse. Each takes
milliseconds to make at the default sizes."""

from __future__ import annotations

import io
from collections.abc import Callable
from fractions import Fraction

import av
import numpy as np

# container name -> (FFmpeg muxer, codec, pixel format)
FORMATS = {
    "mp4": ("mp4", "libx264", "yuv420p"),
    "mov": ("mov", "libx264", "yuv420p"),
    "webm": ("webm", "libvpx-vp9", "yuv420p"),
    "mkv": ("matroska", "mpeg4", "yuv420p"),
    "mkv-lossless": ("matroska", "ffv1", "bgr0"),  # decodes to exactly `source_frames`
}
# Encoder settings that give the same bytes every run, fast.
ENCODER_OPTIONS = {
    "libx264": {"threads": "1", "preset": "ultrafast"},
    "libvpx-vp9": {"threads": "1", "deadline": "realtime", "cpu-used": "8"},
}


def source_frames(num_frames: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """[num_frames, height, width, 3] uint8 RGB: seeded noise over a gradient that moves
    7 px per frame (so neighbouring frames differ, and every seed gives another clip)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float32)
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    for index in range(num_frames):
        gradient = np.roll(ramp, index * 7)[None, :, None]
        noise = rng.integers(0, 96, (height, width, 3))
        frames[index] = np.clip(gradient * 0.6 + noise, 0, 255).astype(np.uint8)
    return frames


def make_video(
    num_frames: int = 8,
    fps: float | Fraction = 4.0,
    width: int = 64,
    height: int = 48,
    container: str = "mp4",
    seed: int = 0,
) -> bytes:
    """A clip of `source_frames(num_frames, width, height, seed)` in `container` (a key
    of FORMATS)."""
    return encode(source_frames(num_frames, width, height, seed), fps, *FORMATS[container])


def encode(
    pixels: np.ndarray,
    fps: float | Fraction,
    muxer: str,
    codec: str,
    pix_fmt: str = "yuv420p",
    muxer_options: dict[str, str] | None = None,
    gop_size: int | None = None,
) -> bytes:
    """RGB frames [n, h, w, 3] -> the bytes of a `muxer` file of `codec` at `fps`."""
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1000)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer, options=muxer_options or {}) as output:
        stream = output.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = pixels.shape[2], pixels.shape[1], pix_fmt
        stream.options = dict(ENCODER_OPTIONS.get(codec, {}))
        if gop_size is not None:
            stream.gop_size = gop_size
        for frame in pixels:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def long_video(hours: float = 10.0, declared: bool = True) -> bytes:
    """Two 32 x 32 frames, each shown for half of `hours`: hundreds of bytes. Without
    `declared`, Matroska's live mode leaves the duration out of the header, so only the
    frame count and rate tell the length."""
    fps = Fraction(2, round(hours * 3600))
    options = None if declared else {"live": "1"}
    return encode(source_frames(2, 32, 32), fps, "matroska", "mpeg4", muxer_options=options)


def claiming_frame_size(width: int, height: int) -> bytes:
    """A Matroska clip of two raw 256 x 256 frames whose track header claims frames of
    `width` x `height` (at most 65535): what a hostile file says to make a decoder
    allocate, at no cost to make. Rewrites the PixelWidth (0xB0) and PixelHeight (0xBA)
    elements, two bytes each for a 256 px clip."""
    gray = np.zeros((2, 256, 256, 3), np.uint8)
    data = bytearray(encode(gray, 1, "matroska", "rawvideo", "gray"))
    for element, value in ((b"\xb0\x82", width), (b"\xba\x82", height)):
        at = data.find(element)
        if at < 0:
            raise ValueError("no two-byte frame size element in the clip")
        data[at + 2 : at + 4] = value.to_bytes(2, "big")
    return bytes(data)


def no_frames() -> bytes:
    """A Matroska container with a video stream's header and not one frame (FFmpeg
    cannot open it: it finds no data to read the stream's parameters from)."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as output:
        stream = output.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        output.start_encoding()
    return buffer.getvalue()


def empty_video_track() -> bytes:
    """A Matroska file whose video track holds no frame, beside an audio track of 0.4 s:
    it opens, and its video stream has nothing to count."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as output:
        video = output.add_stream("mpeg4", rate=4)
        video.width, video.height, video.pix_fmt = 32, 32, "yuv420p"
        audio = output.add_stream("pcm_s16le", rate=8000)
        for index in range(4):
            frame = av.AudioFrame.from_ndarray(
                np.zeros((1, 800), np.int16), format="s16", layout="mono"
            )
            frame.sample_rate, frame.pts = 8000, index * 800
            for packet in audio.encode(frame):
                output.mux(packet)
        for packet in audio.encode():
            output.mux(packet)
    return buffer.getvalue()


def remuxed(data: bytes, muxer: str, edit: Callable[[list[av.Packet]], list[av.Packet]]) -> bytes:
    """The video stream of `data` copied packet by packet (not re-encoded) into `muxer`,
    after `edit` changed the list of packets."""
    buffer = io.BytesIO()
    with av.open(io.BytesIO(data)) as source, av.open(buffer, "w", format=muxer) as output:
        stream = output.add_stream_from_template(source.streams.video[0])
        packets = [p for p in source.demux(source.streams.video[0]) if p.dts is not None]
        for packet in edit(packets):
            packet.stream = stream
            output.mux(packet)
    return buffer.getvalue()


def trimmed(num_frames: int = 8, hidden: int = 2) -> bytes:
    """An MP4 of H.264 whose edit list hides its first `hidden` frames, as `ffmpeg -ss T
    -c copy` writes a cut between keyframes: the packets stay (they are needed to decode
    the rest) and FFmpeg drops their frames."""
    clip = make_video(num_frames, 4.0, 64, 48, "mp4")

    def shift(packets: list[av.Packet]) -> list[av.Packet]:
        step = packets[1].pts - packets[0].pts
        for packet in packets:
            packet.pts -= hidden * step
            packet.dts -= hidden * step
        return packets

    return remuxed(clip, "mp4", shift)


def cut_between_keyframes(num_frames: int = 8, dropped: int = 2) -> bytes:
    """A Matroska file of H.264 (a keyframe every 4 frames) missing its first `dropped`
    packets, edit list or none: the frames before the next keyframe do not decode."""
    pixels = source_frames(num_frames, 64, 48)
    clip = encode(pixels, 4.0, "matroska", "libx264", gop_size=4)
    return remuxed(clip, "matroska", lambda packets: packets[dropped:])


def size_change(first: tuple[int, int], then: tuple[int, int]) -> bytes:
    """A WebM of VP9 whose frames are `first` (width, height) for 2 frames, then `then`
    from a keyframe on (VP9 may change size at a keyframe; the header tells the first)."""
    parts = [
        encode(np.full((2, h, w, 3), 60 * i, np.uint8), 4.0, "webm", "libvpx-vp9")
        for i, (w, h) in enumerate((first, then))
    ]
    with av.open(io.BytesIO(parts[1])) as source:
        tail = [p for p in source.demux(video=0) if p.dts is not None]

    def append(packets: list[av.Packet]) -> list[av.Packet]:
        for position, packet in enumerate(packets + tail):
            packet.pts, packet.dts, packet.duration = position, position, 1
            packet.time_base = Fraction(1, 4)
        return packets + tail

    return remuxed(parts[0], "webm", append)


def unknown_codec() -> bytes:
    """An MP4 whose H.264 track's sample entry is renamed to a codec no one knows."""
    data = bytearray(make_video(2, 4.0, 32, 32, "mp4"))
    at = data.find(b"avc1", data.find(b"stsd"))
    data[at : at + 4] = b"zzzz"
    return bytes(data)


def other_container(muxer: str = "avi") -> bytes:
    """MPEG-4 video in a container FFmpeg reads and the services do not take."""
    return encode(source_frames(3, 32, 32), 4.0, muxer, "mpeg4")
