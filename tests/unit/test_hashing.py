"""Content hashes (invariant 4: a key names everything the rows depend on) and safe
decoding of media bytes (invariant 6: bad input gets a clear error)."""

from __future__ import annotations

import io
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tessera.hashing import (
    CONTENT_HASH_HEX_LENGTH,
    content_hash,
    framed_digest,
    is_content_hash,
    model_fingerprint,
)
from tessera.media import MediaError, decode_image

FINGERPRINT = "0123456789abcdef0123456789abcdef"


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    channels = len(mode)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


# --- framing and hash format -----------------------------------------------------------


def test_framing_prevents_concatenation_collisions():
    assert framed_digest([b"ab", b"c"]) != framed_digest([b"a", b"bc"])
    assert framed_digest([b"abc"]) != framed_digest([b"abc", b""])
    assert framed_digest([b"ab", b"c"]) == framed_digest([b"ab", b"c"])


def test_content_hash_is_64_lowercase_hex():
    value = content_hash(FINGERPRINT, "image", "RGB", (1, 1), b"\x00\x00\x00")
    assert len(value) == CONTENT_HASH_HEX_LENGTH == 64  # 256 bits
    assert is_content_hash(value)


@pytest.mark.parametrize(
    "value",
    ["A" * 64, "ab" * 31, "ab" * 33, "g" * 64, "", " " + "a" * 63, "0x" + "a" * 62],
)
def test_is_content_hash_rejects_malformed(value):
    assert not is_content_hash(value)


def test_every_field_changes_the_hash():
    base = (FINGERPRINT, "image", "RGB", (2, 1), b"\x01" * 6)
    variants = [
        ("f" * 32, "image", "RGB", (2, 1), b"\x01" * 6),
        (FINGERPRINT, "audio", "RGB", (2, 1), b"\x01" * 6),
        (FINGERPRINT, "image", "BGR", (2, 1), b"\x01" * 6),
        (FINGERPRINT, "image", "RGB", (1, 2), b"\x01" * 6),
        (FINGERPRINT, "image", "RGB", (2, 1), b"\x01" * 5 + b"\x02"),
    ]
    hashes = {content_hash(*base), *(content_hash(*v) for v in variants)}
    assert len(hashes) == 1 + len(variants)


def test_memoryview_content_hashes_like_bytes():
    data = bytes(range(12))
    assert content_hash(FINGERPRINT, "image", "RGB", (2, 2), memoryview(data)) == content_hash(
        FINGERPRINT, "image", "RGB", (2, 2), data
    )


# --- hashes of decoded images ----------------------------------------------------------


def test_same_bytes_resent_give_same_hash():
    data = encoded(noise(20, 10))
    assert decode_image(data).content_hash(FINGERPRINT) == decode_image(bytes(data)).content_hash(
        FINGERPRINT
    )


def test_transposed_shape_with_same_pixel_bytes_differs():
    raw = bytes(np.random.default_rng(1).integers(0, 256, 30 * 100 * 3, dtype=np.uint8))
    wide = decode_image(encoded(Image.frombytes("RGB", (100, 30), raw)))
    tall = decode_image(encoded(Image.frombytes("RGB", (30, 100), raw)))
    assert wide.image.tobytes() == tall.image.tobytes()
    assert wide.content_hash(FINGERPRINT) != tall.content_hash(FINGERPRINT)


def test_one_changed_pixel_changes_the_hash():
    image = noise(32, 32)
    changed = image.copy()
    changed.putpixel((31, 31), tuple(255 - v for v in image.getpixel((31, 31))))
    assert decode_image(encoded(image)).content_hash(FINGERPRINT) != decode_image(
        encoded(changed)
    ).content_hash(FINGERPRINT)


def test_other_model_fingerprint_differs():
    image = decode_image(encoded(noise(8, 8)))
    assert image.content_hash(FINGERPRINT) != image.content_hash("f" * 32)


def test_other_mode_with_same_bytes_differs():
    raw = bytes(np.random.default_rng(2).integers(0, 256, 16 * 16 * 4, dtype=np.uint8))
    rgba = decode_image(encoded(Image.frombytes("RGBA", (16, 16), raw), "PNG"))
    cmyk = decode_image(encoded(Image.frombytes("CMYK", (16, 16), raw), "TIFF"))
    assert (rgba.image.mode, cmyk.image.mode) == ("RGBA", "CMYK")
    assert rgba.image.tobytes() == cmyk.image.tobytes()
    assert rgba.content_hash(FINGERPRINT) != cmyk.content_hash(FINGERPRINT)


def test_lossless_reencode_gives_same_hash():
    image = noise(17, 9)
    png, bmp, tiff = (decode_image(encoded(image, fmt)) for fmt in ("PNG", "BMP", "TIFF"))
    assert png.content_hash(FINGERPRINT) == bmp.content_hash(FINGERPRINT)
    assert png.content_hash(FINGERPRINT) == tiff.content_hash(FINGERPRINT)


def test_palette_images_with_other_colours_differ():
    """Same palette indices, other palette: other pictures, so other hashes."""
    indices = Image.new("P", (4, 4))
    red, blue = indices.copy(), indices.copy()
    red.putpalette([255, 0, 0] * 256)
    blue.putpalette([0, 0, 255] * 256)
    assert decode_image(encoded(red)).content_hash(FINGERPRINT) != decode_image(
        encoded(blue)
    ).content_hash(FINGERPRINT)


def test_palette_image_hashes_like_its_colours():
    palette = noise(9, 7).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    as_rgb = palette.convert("RGB")
    assert decode_image(encoded(palette)).content_hash(FINGERPRINT) == decode_image(
        encoded(as_rgb)
    ).content_hash(FINGERPRINT)


def test_transparency_key_changes_the_hash():
    """A PNG tRNS colour key makes those pixels transparent (the processor paints them
    white), so the same RGB samples with and without it are other pictures."""
    image = noise(6, 6)
    with_key = io.BytesIO()
    image.save(with_key, "PNG", transparency=image.getpixel((0, 0)))
    plain = decode_image(encoded(image)).content_hash(FINGERPRINT)
    assert decode_image(with_key.getvalue()).content_hash(FINGERPRINT) != plain


# --- model fingerprints ----------------------------------------------------------------


def fake_checkpoint(directory: Path, weights: bytes, config: str = '{"a": 1}') -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(config)
    (directory / "model.safetensors").write_bytes(weights)
    return directory


def test_fingerprint_is_stable_for_the_same_files(tmp_path):
    weights = os.urandom(4096)
    first = model_fingerprint(fake_checkpoint(tmp_path / "a", weights))
    assert model_fingerprint(tmp_path / "a") == first
    assert model_fingerprint(fake_checkpoint(tmp_path / "b", weights)) == first


def test_fingerprint_changes_with_weight_bytes(tmp_path):
    weights = bytearray(os.urandom(4096))
    before = model_fingerprint(fake_checkpoint(tmp_path, bytes(weights)))
    weights[2000] ^= 1
    (tmp_path / "model.safetensors").write_bytes(bytes(weights))
    assert model_fingerprint(tmp_path) != before


def test_fingerprint_changes_with_config(tmp_path):
    weights = os.urandom(1024)
    before = model_fingerprint(fake_checkpoint(tmp_path, weights, '{"a": 1}'))
    after = model_fingerprint(fake_checkpoint(tmp_path, weights, '{"a": 2}'))
    assert before != after


def test_fingerprint_ignores_unrelated_files(tmp_path):
    before = model_fingerprint(fake_checkpoint(tmp_path, os.urandom(1024)))
    (tmp_path / "README.md").write_text("notes")
    assert model_fingerprint(tmp_path) == before


def test_fingerprint_of_empty_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config or weight files"):
        model_fingerprint(tmp_path)


# --- decode_image refusals -------------------------------------------------------------


def test_empty_bytes_refused():
    with pytest.raises(MediaError, match="image part is empty"):
        decode_image(b"")


def test_garbage_bytes_refused():
    with pytest.raises(MediaError, match="could not be decoded"):
        decode_image(b"this is not an image at all" * 10)


@pytest.mark.parametrize("image_format", ["EPS", "ICO", "PPM", "TGA"])
def test_formats_outside_the_allow_list_are_refused_from_the_header(image_format):
    """EPS used to reach Ghostscript: only PNG, JPEG, WebP, GIF, BMP and TIFF are read."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 10, 10)).save(buffer, format=image_format)
    with pytest.raises(MediaError, match="as one of PNG, JPEG, WEBP, GIF, BMP, TIFF"):
        decode_image(buffer.getvalue())


@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_allowed_formats_decode(image_format):
    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), (200, 10, 10)).save(buffer, format=image_format)
    assert (decode_image(buffer.getvalue()).width, decode_image(buffer.getvalue()).height) == (
        16,
        12,
    )


def test_truncated_png_refused():
    data = encoded(noise(64, 64))
    with pytest.raises(MediaError, match="could not be decoded"):
        decode_image(data[: len(data) // 2])


def test_too_many_pixels_refused():
    data = encoded(noise(100, 100))
    with pytest.raises(MediaError, match=r"100x100 = 10000 pixels, above the limit of 5000"):
        decode_image(data, max_pixels=5000)
    assert decode_image(data, max_pixels=10_000).width == 100


def png_header_only(width: int, height: int) -> bytes:
    """A PNG signature and IHDR claiming `width`x`height` RGB, then one empty IDAT chunk
    and IEND: nothing to decode, so only a header check can produce the size error."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )


def test_large_header_refused_before_decoding():
    # The header claims 8000 x 8000 = 64M pixels (192 MB decoded); the data holds none.
    data = png_header_only(8000, 8000)
    with pytest.raises(MediaError, match="8000x8000 = 64000000 pixels, above the limit of 1000000"):
        decode_image(data, max_pixels=1_000_000)


def test_decompression_bomb_header_refused_with_a_clear_message():
    # 20000 x 20000 = 400M pixels: past PIL's own bomb limit, which fires in Image.open.
    with pytest.raises(MediaError, match=r"too many pixels.*send a smaller image"):
        decode_image(png_header_only(20_000, 20_000))


def test_refusal_does_not_load_pixels(monkeypatch):
    def fail_load(self):
        raise AssertionError("pixels were decoded before the size check")

    data = encoded(noise(100, 100))
    monkeypatch.setattr(Image.Image, "load", fail_load)
    monkeypatch.setattr("PIL.ImageFile.ImageFile.load", fail_load)
    with pytest.raises(MediaError, match="above the limit"):
        decode_image(data, max_pixels=5000)
