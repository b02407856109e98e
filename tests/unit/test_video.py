"""Decoding videos: every accepted container gives the sampled frames of its stream (and
only those, at the indices sampled), the content hash names exactly the frames and
options, and every bad input is refused with what to fix before it costs more than its
header and packets. No test depends on timing: the decode-time bound is tested at 0."""

from __future__ import annotations

import io
import random

import av
import numpy as np
import pytest
from PIL import Image

from tessera.media import ProcessingOptions
from tessera.testbed.video_files import (
    claiming_frame_size,
    cut_between_keyframes,
    empty_video_track,
    long_video,
    make_video,
    no_frames,
    other_container,
    size_change,
    source_frames,
    trimmed,
    unknown_codec,
)
from tessera.video import (
    DecodedVideo,
    VideoError,
    VideoInfo,
    VideoLimits,
    decode_video,
    probe_video,
    uniform_sampler,
)

LIMITS = VideoLimits(max_seconds=60.0, max_frames=32)
CODECS = {"mp4": "h264", "mov": "h264", "webm": "vp9", "mkv": "mpeg4", "mkv-lossless": "ffv1"}
DEMUXERS = {"mp4": "mov,mp4,m4a,3gp,3g2,mj2", "mov": "mov,mp4,m4a,3gp,3g2,mj2"}


def every(info: VideoInfo) -> list[int]:
    return list(range(info.total_num_frames))


def every_other(info: VideoInfo) -> list[int]:
    return list(range(0, info.total_num_frames, 2))


def never(info: VideoInfo) -> list[int]:
    raise AssertionError("the sampler ran: the video was not refused from its header")


def all_frames(data: bytes) -> np.ndarray:
    """Every frame by a plain PyAV loop, for comparison."""
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def nearest_sources(frames: np.ndarray, sources: np.ndarray) -> list[int]:
    """For each decoded frame of a lossy codec, the source frame it is closest to."""
    distance = np.abs(frames[:, None].astype(np.int16) - sources[None].astype(np.int16))
    return distance.mean(axis=(2, 3, 4)).argmin(axis=1).tolist()


@pytest.mark.parametrize("container", ["mp4", "mov", "webm", "mkv"])
def test_each_container_gives_its_sampled_frames(container):
    data = make_video(10, 5.0, 64, 48, container, seed=3)
    info = probe_video(data, LIMITS)
    assert (info.width, info.height, info.total_num_frames) == (64, 48, 10)
    assert info.fps == pytest.approx(5.0) and info.duration_seconds == pytest.approx(2.0)
    assert info.codec == CODECS[container]
    assert info.container == DEMUXERS.get(container, "matroska,webm")
    video = decode_video(data, LIMITS, every_other)
    assert video.frames.shape == (5, 48, 64, 3) and video.frames.dtype == np.uint8
    assert video.frame_indices == (0, 2, 4, 6, 8)
    assert (video.fps, video.total_num_frames) == (info.fps, 10)
    assert np.array_equal(video.frames, all_frames(data)[::2])
    assert nearest_sources(video.frames, source_frames(10, 64, 48, seed=3)) == [0, 2, 4, 6, 8]
    assert video.timestamps() == pytest.approx((0.0, 0.4, 0.8, 1.2, 1.6))


def test_a_lossless_clip_decodes_to_exactly_the_frames_encoded():
    data = make_video(6, 4.0, 64, 48, "mkv-lossless", seed=5)
    video = decode_video(data, LIMITS, lambda info: [1, 4, 5])
    assert probe_video(data, LIMITS).codec == "ffv1"
    assert np.array_equal(video.frames, source_frames(6, 64, 48, seed=5)[[1, 4, 5]])


def test_uniform_sampling_keeps_only_the_frames_it_names():
    data = make_video(10, 4.0, 32, 32, "mkv-lossless", seed=7)
    video = decode_video(data, LIMITS, uniform_sampler(4))
    assert video.frame_indices == (0, 2, 5, 7), "floor(i * 10 / 4)"
    assert np.array_equal(video.frames, source_frames(10, 32, 32, seed=7)[[0, 2, 5, 7]])
    assert decode_video(data, LIMITS, uniform_sampler(50)).frame_indices == tuple(range(10))
    with pytest.raises(ValueError):
        uniform_sampler(0)


def test_the_frames_cannot_be_changed_after_they_are_hashed():
    video = decode_video(make_video(4, 4.0, 32, 32, "mp4"), LIMITS, every)
    with pytest.raises(ValueError, match="read-only"):
        video.frames[0, 0, 0, 0] = 1


def test_the_content_hash_names_frames_sampling_rate_and_options():
    data = make_video(8, 4.0, 32, 32, "mp4", seed=1)
    video = decode_video(data, LIMITS, every)
    name = video.content_hash("model")
    assert decode_video(data, LIMITS, every).content_hash("model") == name, "stable"
    assert video.content_hash("model", ProcessingOptions()) == name
    assert decode_video(data, LIMITS, every_other).content_hash("model") != name
    other = make_video(8, 4.0, 32, 32, "mp4", seed=2)
    assert decode_video(other, LIMITS, every).content_hash("model") != name
    assert video.content_hash("model", ProcessingOptions.of({"fps": 1})) != name
    assert video.content_hash("other model") != name
    frames, indices = video.frames, video.frame_indices
    assert DecodedVideo(frames, indices, 4.0, 8).content_hash("model") == name
    assert DecodedVideo(frames, indices, 5.0, 8).content_hash("model") != name, "fps"
    assert DecodedVideo(frames, indices, 4.0, 9).content_hash("model") != name, "length"
    moved = (*(i + 1 for i in indices[:-1]), 9)
    assert DecodedVideo(frames, moved, 4.0, 10).content_hash("model") != name, "indices"


# Read-only frames: torch warns once per process that it shares their memory read-only.
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable:UserWarning")
def test_the_processor_takes_the_frames_and_metadata():
    from transformers import Qwen2VLVideoProcessor

    video = decode_video(make_video(8, 4.0, 56, 56, "webm"), LIMITS, every)
    metadata = video.metadata()
    assert (metadata.total_num_frames, metadata.fps, metadata.duration) == (8, 4.0, 2.0)
    assert (metadata.width, metadata.height, metadata.video_backend) == (56, 56, "pyav")
    assert metadata.frames_indices == list(range(8))
    processed = Qwen2VLVideoProcessor()(
        videos=[video.frames],
        video_metadata=[metadata],
        do_sample_frames=False,
        cap_pixels_per_frame=False,
        return_tensors="pt",
    )
    t, h, w = processed["video_grid_thw"][0].tolist()
    assert t == 4 and h == w, "8 frames in 4 temporal steps, square frames stay square"


def test_frames_an_edit_list_hides_are_not_counted():
    """`ffmpeg -ss -c copy` keeps the packets before the cut (to decode the rest) and
    hides them by an edit list: the clip is the 6 frames shown, not 8."""
    data = trimmed(num_frames=8, hidden=2)
    assert probe_video(data, LIMITS).total_num_frames == 6
    video = decode_video(data, LIMITS, every)
    assert np.array_equal(video.frames, all_frames(data))
    assert nearest_sources(video.frames, source_frames(8, 64, 48)) == [2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("sampled", [[0, 1], [5]], ids=["at the start", "at the end"])
def test_frames_that_do_not_decode_refuse_the_video(sampled):
    """A stream cut between keyframes counts 6 frames and decodes the last 4: sampled
    frames would be others than their indices say, so the file is refused."""
    data = cut_between_keyframes(num_frames=8, dropped=2)
    assert probe_video(data, LIMITS).total_num_frames == 6
    with pytest.raises(VideoError, match="broken, truncated or cut between keyframes"):
        decode_video(data, LIMITS, lambda info: sampled)


def test_a_frame_size_change_is_refused():
    with pytest.raises(VideoError, match="frame 2 is 96x64, not the stream's 64x48"):
        decode_video(size_change((64, 48), (96, 64)), LIMITS, every)


def test_the_decoder_refuses_a_large_frame_the_header_did_not_announce():
    """Header 64 x 48, then a 1280 x 1024 keyframe: FFmpeg refuses it before allocating
    it (its bound is 2x the limit, at least 2^20 pixels), not after."""
    data = size_change((64, 48), (1280, 1024))
    limits = VideoLimits(max_frame_pixels=64 * 48)
    with pytest.raises(VideoError, match=r"could not be decoded.*--max-video-frame-pixels"):
        decode_video(data, limits, every)


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "counted"])
def test_a_ten_hour_video_is_refused_before_sampling(declared):
    """From the header's duration where it states one, else from the packets' count."""
    fragment = "declares 36000.0 s" if declared else r"runs 18000.0 s or more \(1 frame\(s\)"
    with pytest.raises(VideoError, match=f"{fragment}.*--max-video-seconds"):
        decode_video(long_video(hours=10, declared=declared), LIMITS, never)


def png() -> bytes:
    image = io.BytesIO()
    Image.new("RGB", (8, 8)).save(image, format="PNG")
    return image.getvalue()


def bad_inputs() -> dict[str, tuple[bytes, VideoLimits, str]]:
    clip = make_video(24, 4.0, 64, 48, "mp4")
    mkv = make_video(24, 4.0, 64, 48, "mkv")
    accepted = "send an MP4, WebM, MKV or MOV file"
    return {
        "empty": (b"", LIMITS, "empty"),
        "not a video": (png(), LIMITS, f"could not be read.*{accepted}"),
        "text": (b"hello, not a video at all" * 10, LIMITS, accepted),
        "AVI": (other_container("avi"), LIMITS, f"could not be read as an MP4.*{accepted}"),
        "MPEG-TS": (other_container("mpegts"), LIMITS, accepted),
        "unknown codec": (unknown_codec(), LIMITS, "codec is not one FFmpeg decodes"),
        "truncated": (clip[: len(clip) // 3], LIMITS, "could not be read"),
        "truncated mid-stream": (mkv[: len(mkv) * 2 // 3], LIMITS, "declares 6.00 s: it is trunc"),
        "no frames": (no_frames(), LIMITS, "could not be read"),
        "an empty video track": (empty_video_track(), LIMITS, "video stream has no frames"),
        "20000x20000 frames": (
            claiming_frame_size(20_000, 20_000),
            LIMITS,
            "--max-video-frame-pixels",
        ),
        "frames above the limit": (
            make_video(2, 1.0, 64, 48, "webm"),
            VideoLimits(max_frame_pixels=64 * 48 - 1),
            r"64x48 = 3072 pixels, above the limit of 3071 \(--max-video-frame-pixels\)",
        ),
        "too many frames": (clip, VideoLimits(max_frames=4), "24 frames sampled.*--max-video-fr"),
        "too many bytes": (
            clip,
            VideoLimits(max_sampled_bytes=24 * 64 * 48 * 3 - 1),
            "take 221184 bytes as RGB, above the limit of 221183",
        ),
        "no time to decode": (clip, VideoLimits(max_decode_seconds=0.0), "--max-video-decode"),
    }


@pytest.mark.parametrize("name", list(bad_inputs()))
def test_bad_inputs_are_refused_with_what_to_fix(name):
    data, limits, fragment = bad_inputs()[name]
    with pytest.raises(VideoError, match=fragment):
        decode_video(data, limits, every)


def test_the_limits_admit_what_they_name():
    """The bad inputs above fail by one: at the limit the same clip decodes."""
    clip = make_video(24, 4.0, 64, 48, "mp4")
    limits = VideoLimits(max_frames=24, max_frame_pixels=64 * 48, max_sampled_bytes=221184)
    assert decode_video(clip, limits, every).num_frames == 24
    for declared in (True, False):
        long = long_video(hours=10, declared=declared)
        assert decode_video(long, VideoLimits(max_seconds=36_000), every).num_frames == 2
    with pytest.raises(VideoError, match=r"runs 36000\.0 s"):
        decode_video(long, VideoLimits(max_seconds=35_999), every)


def test_sampler_indices_are_checked():
    data = make_video(6, 4.0, 32, 32, "mp4")
    for indices in ([3, 1], [0, 0], [0, 6], [-1, 2], []):
        with pytest.raises(VideoError, match="sampled"):
            decode_video(data, LIMITS, lambda info, chosen=indices: chosen)


@pytest.mark.parametrize("container", ["mp4", "mov", "webm", "mkv"])
def test_every_corruption_is_a_video_error_or_a_video(container):
    """Bytes scattered, zeroed or cut anywhere: FFmpeg's and PyAV's many errors all
    arrive as VideoError (a decoder may also conceal the damage and give frames). The MP4
    sweep finds a sample entry that names no codec FFmpeg has (PyAV's codec_context is
    None there)."""
    clip = make_video(10, 5.0, 64, 48, container, seed=3)
    rng = random.Random(container)
    refused = 0
    for _ in range(40):
        data = bytearray(clip)
        at, kind = rng.randrange(len(data)), rng.choice(["scatter", "zero", "cut"])
        if kind == "scatter":
            for _ in range(rng.randint(1, 20)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == "zero":
            data[at : at + 64] = bytes(len(data[at : at + 64]))
        else:
            del data[at:]
        try:
            video = decode_video(bytes(data), LIMITS, every)
        except VideoError:
            refused += 1
            continue
        assert video.frames.shape[1:] == (48, 64, 3)
    assert 0 < refused < 40, "the sweep both breaks files and leaves some decodable"
