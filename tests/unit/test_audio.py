"""Audio decoding: every container users send decodes to the same mono clip at the
family's rate; limits, truncation and garbage are refused with a message that says what
to fix; the content hash covers the samples, the rate and the options."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.audio import AudioError, decode_audio
from tessera.media import ProcessingOptions
from tessera.media_decoder import MediaDecoder, MediaLimits
from tessera.placeholders import Modality
from tessera.testbed.audio_files import ffmpeg_file, sound_file, tone
from tessera.testbed.reference import noise_image, reference_audio

RATE = 16_000
STEREO_44K = tone(1, 1.5, 44_100, channels=2)


@pytest.mark.parametrize(
    "name,encode",
    [
        ("wav-pcm16", lambda x: sound_file(x, 44_100)),
        ("wav-float", lambda x: sound_file(x, 44_100, "WAV", "FLOAT")),
        ("flac", lambda x: sound_file(x, 44_100, "FLAC")),
        ("ogg-vorbis", lambda x: sound_file(x, 44_100, "OGG", "VORBIS")),
        ("mp3", lambda x: ffmpeg_file(x, 44_100, "mp3", "libmp3lame")),
    ],
)
def test_containers_decode_to_mono_at_the_family_rate(name, encode):
    clip = decode_audio(encode(STEREO_44K), RATE, 30)
    assert clip.sampling_rate == RATE and clip.samples.dtype == np.float32
    assert clip.samples.ndim == 1
    # Lossy codecs add priming samples; the length is the clip's within a frame or two.
    assert abs(clip.seconds - 1.5) < 0.08, clip.seconds
    if name.startswith("wav") or name == "flac":  # lossless: what libsndfile + soxr give
        expected = reference_audio(encode(STEREO_44K), RATE)
        np.testing.assert_allclose(clip.samples, expected, atol=1e-4)


def test_opus_at_48k_decodes():
    clip = decode_audio(ffmpeg_file(tone(2, 1.0, 48_000), 48_000, "ogg", "libopus"), RATE, 30)
    assert abs(clip.seconds - 1.0) < 0.05


def test_a_clip_at_the_family_rate_is_not_resampled():
    samples = tone(3, 0.5, RATE)
    clip = decode_audio(sound_file(samples, RATE, "WAV", "FLOAT"), RATE, 30)
    np.testing.assert_array_equal(clip.samples, samples[:, 0])


@pytest.mark.parametrize(
    "data,message",
    [
        (b"", "empty"),
        (b"not audio at all" * 20, "could not be decoded"),
        (noise_image(1, 20, 20), "no audio stream"),
        (sound_file(tone(1, 1.0, RATE), RATE)[:-100], "truncated"),
        (sound_file(tone(1, 2.0, RATE), RATE, "FLAC")[:3000], "could not be decoded"),
        (ffmpeg_file(tone(1, 2.0, RATE), RATE, "mp3", "libmp3lame")[:4000], "truncated"),
        (sound_file(np.zeros((0, 1), np.float32), RATE), "no samples"),
        (sound_file(tone(1, 31.0, 8_000), 8_000), "above the limit of 30 s"),
    ],
    ids=["empty", "garbage", "png", "wav-cut", "flac-cut", "mp3-cut", "no-samples", "too-long"],
)
def test_unusable_audio_is_refused_with_what_to_fix(data, message):
    with pytest.raises(AudioError, match=message):
        decode_audio(data, RATE, 30)


def test_non_finite_samples_and_absurd_rates_are_refused():
    samples = tone(1, 0.5, RATE)
    samples[10, 0] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        decode_audio(sound_file(samples, RATE, "WAV", "FLOAT"), RATE, 30)
    with pytest.raises(AudioError, match="sampling rate is 1 Hz"):
        decode_audio(sound_file(tone(1, 20.0, 1), 1), RATE, 30)


def test_the_length_limit_holds_without_a_declared_length():
    # A WAV whose data size was never filled in (a streaming writer): the limit is
    # enforced while decoding.
    wav = bytearray(sound_file(tone(1, 3.0, RATE), RATE))
    position = wav.index(b"data")
    wav[position + 4 : position + 8] = (0xFFFFFFFF).to_bytes(4, "little")
    assert decode_audio(bytes(wav), RATE, 30).seconds == pytest.approx(3.0, abs=0.01)
    with pytest.raises(AudioError, match="above the limit of 2 s"):
        decode_audio(bytes(wav), RATE, 2)


def test_content_hash_covers_samples_rate_and_options():
    data = sound_file(tone(4, 1.0, RATE), RATE)
    clip = decode_audio(data, RATE, 30)
    same = decode_audio(data, RATE, 30).content_hash("f")
    assert clip.content_hash("f") == same
    assert decode_audio(sound_file(tone(5, 1.0, RATE), RATE), RATE, 30).content_hash("f") != same
    assert decode_audio(data, 24_000, 30).content_hash("f") != same
    assert clip.content_hash("other model") != same
    assert clip.content_hash("f", ProcessingOptions.of({"x": 1})) != same
    # The same samples in another container are the same content.
    pcm = (tone(4, 1.0, RATE) * 32767).astype(np.int16)
    wav, flac = sound_file(pcm, RATE), sound_file(pcm, RATE, "FLAC")
    assert decode_audio(wav, RATE, 30).content_hash("f") == decode_audio(
        flac, RATE, 30
    ).content_hash("f")


def test_the_media_decoder_caps_audio_at_the_family_limit():
    decoder = MediaDecoder(MediaLimits(max_audio_seconds=600), RATE, family_max_audio_seconds=30)
    assert decoder.max_audio_seconds == 30
    with pytest.raises(AudioError, match="limit of 30 s"):
        decoder.decode(Modality.AUDIO, sound_file(tone(1, 31.0, 8_000), 8_000))
    image_only = MediaDecoder(MediaLimits(), None)
    with pytest.raises(ValueError, match="takes no audio"):
        image_only.decode(Modality.AUDIO, sound_file(tone(1, 1.0, RATE), RATE))
