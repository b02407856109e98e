"""Test videos encoded by PyAV in memory: seeded, different in every frame, in the
containers users send (MP4 and MOV with H.264, WebM with VP9, Matroska with MPEG-4), and
the bad inputs the services must refuse."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

# container name -> (FFmpeg muxer, codec)
FORMATS = {
    "mp4": ("mp4", "libx264"),
    "mov": ("mov", "libx264"),
    "webm": ("webm", "libvpx-vp9"),
    "mkv": ("matroska", "mpeg4"),
}


def make_video(
    num_frames: int = 8,
    fps: float | Fraction = 4.0,
    width: int = 64,
    height: int = 48,
    container: str = "mp4",
    seed: int = 0,
) -> bytes:
    """A clip whose frames are seeded noise over a moving gradient (so neighbouring frames
    differ, and every seed gives another clip)."""
    muxer, codec = FORMATS[container]
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1000)
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as output:
        stream = output.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":  # no threads, no lookahead: the same bytes every run
            stream.options = {"threads": "1", "preset": "ultrafast"}
        ramp = np.linspace(0, 255, width, dtype=np.float32)
        for index in range(num_frames):
            gradient = np.roll(ramp, index * 7)[None, :, None]
            noise = rng.integers(0, 96, (height, width, 3))
            pixels = np.clip(gradient * 0.6 + noise, 0, 255).astype(np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def claiming_frame_size(width: int, height: int) -> bytes:
    """A Matroska clip of two raw 256 x 256 frames whose track header claims frames of
    `width` x `height` (at most 65535): what a hostile file says to make a decoder
    allocate, at no cost to make. Rewrites the PixelWidth (0xB0) and PixelHeight (0xBA)
    elements, two bytes each for a 256 px clip."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as output:
        stream = output.add_stream("rawvideo", rate=1)
        stream.width, stream.height, stream.pix_fmt = 256, 256, "gray"
        for _ in range(2):
            frame = av.VideoFrame.from_ndarray(np.zeros((256, 256), np.uint8), format="gray")
            for packet in stream.encode(frame):
                output.mux(packet)
    data = bytearray(buffer.getvalue())
    for element, value in ((b"\xb0\x82", width), (b"\xba\x82", height)):
        at = data.find(element)
        if at < 0:
            raise ValueError("no two-byte frame size element in the clip")
        data[at + 2 : at + 4] = value.to_bytes(2, "big")
    return bytes(data)


def no_frames() -> bytes:
    """A Matroska container with a video stream's header and not one frame."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="matroska") as output:
        stream = output.add_stream("mpeg4", rate=4)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        output.start_encoding()
    return buffer.getvalue()
