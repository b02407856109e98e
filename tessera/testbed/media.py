"""Seeded media for tests, benchmarks and the chaos harness."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def noise_image(seed: int, width: int, height: int, mode: str = "RGB") -> bytes:
    """A PNG of seeded noise."""
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
