"""Decoding videos: every accepted container gives the sampled frames of its stream (and
only those), the content hash names exactly the frames and options, and every bad input
is refused with what to fix before it costs more than its header and packets."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from tessera.media import ProcessingOptions
from tessera.testbed.video_files import claiming_frame_size, make_video, no_frames
from tessera.video import (
    VideoError,
    VideoInfo,
    VideoLimits,
    decode_video,
    probe_video,
)

LIMITS = VideoLimits(max_seconds=60.0, max_frames=32)


def every(info: VideoInfo) -> list[int]:
    return list(range(info.total_num_frames))


def every_other(info: VideoInfo) -> list[int]:
    return list(range(0, info.total_num_frames, 2))


def all_frames(data: bytes) -> np.ndarray:
    """Every frame by a plain PyAV loop, for comparison."""
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


@pytest.mark.parametrize("container", ["mp4", "mov", "webm", "mkv"])
def test_each_container_gives_its_sampled_frames(container):
    data = make_video(10, 5.0, 64, 48, container, seed=3)
    info = probe_video(data, LIMITS)
    assert (info.width, info.height, info.total_num_frames) == (64, 48, 10)
    assert info.fps == pytest.approx(5.0)
    video = decode_video(data, LIMITS, every_other)
    assert video.frames.shape == (5, 48, 64, 3)
    assert video.frame_indices == (0, 2, 4, 6, 8)
    assert np.array_equal(video.frames, all_frames(data)[::2])
    assert video.timestamps() == pytest.approx((0.0, 0.4, 0.8, 1.2, 1.6))
    metadata = video.metadata()
    assert metadata.frames_indices == [0, 2, 4, 6, 8] and metadata.total_num_frames == 10


def test_the_content_hash_names_frames_sampling_and_options():
    data = make_video(8, 4.0, 32, 32, "mp4", seed=1)
    name = decode_video(data, LIMITS, every).content_hash("model")
    assert decode_video(data, LIMITS, every).content_hash("model") == name, "stable"
    assert decode_video(data, LIMITS, every_other).content_hash("model") != name
    other = make_video(8, 4.0, 32, 32, "mp4", seed=2)
    assert decode_video(other, LIMITS, every).content_hash("model") != name
    with_options = ProcessingOptions.of({"fps": 1})
    assert decode_video(data, LIMITS, every).content_hash("model", with_options) != name
    assert decode_video(data, LIMITS, every).content_hash("other model") != name


def test_the_processor_takes_the_frames_and_metadata():
    from transformers import Qwen2VLVideoProcessor

    video = decode_video(make_video(8, 4.0, 56, 56, "webm"), LIMITS, every)
    processed = Qwen2VLVideoProcessor()(
        videos=[video.frames],
        video_metadata=[video.metadata()],
        do_sample_frames=False,
        cap_pixels_per_frame=False,
        return_tensors="pt",
    )
    t, h, w = processed["video_grid_thw"][0].tolist()
    assert t == 4 and h == w, "8 frames in 4 temporal steps, square frames stay square"


def bad_inputs() -> dict[str, tuple[bytes, VideoLimits, str]]:
    clip = make_video(24, 4.0, 64, 48, "mp4")
    mkv = make_video(24, 4.0, 64, 48, "mkv")
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, format="PNG")
    return {
        "empty": (b"", LIMITS, "empty"),
        "not a video": (png.getvalue(), LIMITS, "send an MP4"),
        "text": (b"hello, not a video at all" * 10, LIMITS, "send an MP4"),
        "truncated": (clip[: len(clip) // 3], LIMITS, "could not be read"),
        "truncated mid-stream": (mkv[: len(mkv) * 2 // 3], LIMITS, "truncated|could not"),
        "10 hours": (
            make_video(2, Fraction(1, 18_000), 32, 32, "mkv"),
            LIMITS,
            "--max-video-seconds",
        ),
        "20000x20000 frames": (
            claiming_frame_size(20_000, 20_000),
            LIMITS,
            "--max-video-frame-pixels",
        ),
        "frames above the limit": (
            make_video(2, 1.0, 64, 48, "webm"),
            VideoLimits(max_frame_pixels=64 * 48 - 1),
            "64x48 = 3072 pixels, above the limit of 3071",
        ),
        "too many frames": (clip, VideoLimits(max_frames=4), "--max-video-frames"),
        "no time to decode": (clip, VideoLimits(max_decode_seconds=0.0), "too long"),
    }


@pytest.mark.parametrize("name", list(bad_inputs()))
def test_bad_inputs_are_refused_with_what_to_fix(name):
    data, limits, fragment = bad_inputs()[name]
    with pytest.raises(VideoError, match=fragment):
        decode_video(data, limits, every)


def test_a_video_of_no_frames_is_refused():
    data = no_frames()
    assert data, "a container was written"
    with pytest.raises(VideoError, match=r"no frames|could not be read"):
        decode_video(data, LIMITS, every)


def test_sampler_indices_are_checked():
    data = make_video(6, 4.0, 32, 32, "mp4")
    for indices in ([3, 1], [0, 0], [0, 6], []):
        with pytest.raises(VideoError):
            decode_video(data, LIMITS, lambda info, chosen=indices: chosen)
