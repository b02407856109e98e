"""Decoding audio bytes into what every audio family and the content hash see: mono
float32 PCM at the family's sampling rate.

Decoding uses PyAV (FFmpeg, shipped in its wheels), so WAV, FLAC, OGG/Vorbis/Opus, MP3,
M4A/AAC and whatever else FFmpeg reads all work; channels are averaged (as librosa's
`mono=True`, which the families' reference code uses) and the rate is converted with
soxr at "HQ" quality (librosa's default `soxr_hq`). Nothing here is hand-written DSP.

Limits are checked as early as the bytes allow: the declared duration from the header
before decoding, the decoded length while decoding (a header can lie), the sampling
rate's sanity, and that what came out is finite, not empty and not shorter than the
header said (a truncated file).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from tessera.hashing import content_hash
from tessera.media import ProcessingOptions
from tessera.placeholders import Modality

DEFAULT_MAX_AUDIO_SECONDS = 30.0
# Below telephone quality nothing is speech; above this no recorder writes.
MIN_SAMPLE_RATE = 1_000
MAX_SAMPLE_RATE = 768_000
# A file that decodes to less than this share of its declared length was cut short.
MIN_DECLARED_SHARE = 0.98


class AudioError(ValueError):
    """Audio that cannot be used, with a message that says what to fix."""


@dataclass(frozen=True, eq=False)
class DecodedAudio:
    """Mono float32 samples at `sampling_rate` Hz."""

    samples: np.ndarray
    sampling_rate: int

    @property
    def num_samples(self) -> int:
        return int(self.samples.shape[0])

    @property
    def seconds(self) -> float:
        return self.num_samples / self.sampling_rate

    def content_hash(self, model_fingerprint: str, options: ProcessingOptions | None = None) -> str:
        return content_hash(
            model_fingerprint,
            Modality.AUDIO.value,
            "f32le-mono",
            (self.num_samples, self.sampling_rate),
            np.ascontiguousarray(self.samples, dtype="<f4").tobytes(),
            options.as_dict() if options is not None else {},
        )


def decode_audio(data: bytes, sampling_rate: int, max_seconds: float) -> DecodedAudio:
    """Encoded audio bytes -> mono float32 at `sampling_rate`; raises AudioError naming
    what to fix. `max_seconds` bounds the clip (and so the memory and time it costs)."""
    if not data:
        raise AudioError("audio part is empty; send the bytes of a WAV, FLAC, OGG or MP3 file")
    _check_wav_length(data)
    import av

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError("the file holds no audio stream; send an audio file")
            stream = container.streams.audio[0]
            source_rate = _check_rate(stream.codec_context.sample_rate)
            declared = _declared_seconds(container, stream)
            if declared is not None and declared > max_seconds + 0.01:
                raise _too_long(declared, max_seconds)
            samples = _decode_mono(container, stream, source_rate, max_seconds)
    except AudioError:
        raise
    # FFmpeg raises many kinds of errors on hostile files; all of them mean "not usable".
    except Exception as error:
        raise AudioError(
            f"audio bytes could not be decoded ({error}); send a valid WAV, FLAC, OGG or MP3 file"
        ) from None
    if samples.size == 0:
        raise AudioError("the audio holds no samples; send a clip of at least one sample")
    if declared is not None and samples.size < MIN_DECLARED_SHARE * declared * source_rate:
        raise AudioError(
            f"the audio decodes to {samples.size / source_rate:.3f} s but its header declares "
            f"{declared:.3f} s: the file is truncated or corrupt; send the whole file"
        )
    if not np.isfinite(samples).all():
        raise AudioError("the audio holds NaN or infinite samples; send finite PCM")
    return DecodedAudio(_resample(samples, source_rate, sampling_rate), sampling_rate)


def _check_wav_length(data: bytes) -> None:
    """A WAV file cut short: FFmpeg reads the samples that are there and states the length
    from the file's size, so the RIFF header's own `data` size is compared here (the
    chunk walk of the RIFF spec: 4-byte id, 4-byte little-endian size, padded to even)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    position = 12
    while position + 8 <= len(data):
        chunk_id = data[position : position + 4]
        size = int.from_bytes(data[position + 4 : position + 8], "little")
        if chunk_id == b"data":
            available = len(data) - position - 8
            # 0 and 0xFFFFFFFF: a streaming writer that never went back to fill it in.
            if size not in (0, 0xFFFFFFFF) and available < size:
                raise AudioError(
                    f"the WAV file holds {available} bytes of samples but its header declares "
                    f"{size}: the file is truncated; send the whole file"
                )
            return
        position += 8 + size + (size & 1)


def _check_rate(rate: int | None) -> int:
    if not rate or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise AudioError(
            f"the audio's sampling rate is {rate} Hz; send audio sampled at "
            f"{MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz"
        )
    return int(rate)


def _declared_seconds(container, stream) -> float | None:
    """The length the header states, where the format states one exactly."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    return None


def _decode_mono(container, stream, rate: int, max_seconds: float) -> np.ndarray:
    import av

    max_samples = int(max_seconds * rate) + 1
    # Planar float at the source rate and layout: the channel mean and the rate change
    # happen below, by numpy and soxr.
    to_float = av.AudioResampler(format="fltp")
    pieces: list[np.ndarray] = []
    num_samples = 0
    for frame in container.decode(stream):
        for converted in to_float.resample(frame):
            planes = converted.to_ndarray()  # [channels, samples]
            pieces.append(planes.mean(axis=0, dtype=np.float64).astype(np.float32))
            num_samples += planes.shape[1]
        if num_samples > max_samples:
            raise _too_long(num_samples / rate, max_seconds)
    return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)


def _resample(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    if source_rate == target_rate:
        return samples
    import soxr

    return soxr.resample(samples, source_rate, target_rate, quality="HQ").astype(np.float32)


def _too_long(seconds: float, max_seconds: float) -> AudioError:
    return AudioError(
        f"the audio is {seconds:.1f} s long, above the limit of {max_seconds:g} s "
        "(--max-audio-seconds); send a shorter clip"
    )
