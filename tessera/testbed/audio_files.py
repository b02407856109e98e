"""Seeded audio clips for tests, encoded by real libraries (libsndfile through soundfile,
FFmpeg through PyAV) in the containers users send."""

from __future__ import annotations

import io

import numpy as np

from tessera.client import Audio


def tone(seed: int, seconds: float, rate: int = 16_000, channels: int = 1) -> np.ndarray:
    """[samples, channels] float32: a seeded tone with a little noise, different per channel."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    columns = [
        0.3 * np.sin(2 * np.pi * rng.uniform(100, 2000) * t) + 0.05 * rng.standard_normal(t.size)
        for _ in range(channels)
    ]
    return np.stack(columns, axis=1).astype(np.float32)


def sound_file(
    samples: np.ndarray, rate: int, file_format: str = "WAV", subtype: str = "PCM_16"
) -> bytes:
    """Samples written by libsndfile: WAV, FLAC or OGG (subtype VORBIS or OPUS)."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=file_format, subtype=subtype)
    return buffer.getvalue()


def ffmpeg_file(samples: np.ndarray, rate: int, container: str, codec: str) -> bytes:
    """Samples encoded by FFmpeg through PyAV (e.g. "mp3"/"libmp3lame", "ogg"/"libopus")."""
    import av

    buffer = io.BytesIO()
    layout = "mono" if samples.shape[1] == 1 else "stereo"
    with av.open(buffer, mode="w", format=container) as output:
        stream = output.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples.T), format="fltp", layout=layout
        )
        frame.rate = rate
        for packet in stream.encode(frame):
            output.mux(packet)
        for packet in stream.encode(None):
            output.mux(packet)
    return buffer.getvalue()


def wav_clip(seed: int, seconds: float, rate: int = 16_000, channels: int = 1) -> Audio:
    return Audio(sound_file(tone(seed, seconds, rate, channels), rate))
