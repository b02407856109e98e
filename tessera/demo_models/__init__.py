"""Offline random-weight checkpoints of every supported family, for tests, demos and
benchmarks: `make_demo_model(out_dir, family=..., seed=..., size=...)`.

Each family's module builds the checkpoint with the family's real model, processor and
tokenizer classes, a chat template in the shape of the real checkpoint's, and seeded
weights; see `tessera.demo_models.common`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads the names below without importing torch
    from tessera.demo_models.common import Progress

# family name -> module with `make_demo_model(out_dir, seed, size, progress)`, or
# "module:variant" for a module whose builder serves several families and takes `variant`.
DEMO_FAMILIES: dict[str, str] = {
    "llava": "tessera.demo_models.llava",
    "qwen2-vl": "tessera.demo_models.qwen_vl:qwen2-vl",
    "qwen2.5-vl": "tessera.demo_models.qwen_vl:qwen2.5-vl",
    "qwen3-vl": "tessera.demo_models.qwen_vl:qwen3-vl",
    "qwen3-vl-moe": "tessera.demo_models.qwen_vl:qwen3-vl-moe",
    "llava-onevision": "tessera.demo_models.llava_onevision",
    "gemma3": "tessera.demo_models.gemma3",
    "qwen2-audio": "tessera.demo_models.qwen2_audio",
    "voxtral": "tessera.demo_models.voxtral",
}
# The demo families that take audio (the others take images).
AUDIO_DEMO_FAMILIES = ("qwen2-audio", "voxtral")
IMAGE_DEMO_FAMILIES = tuple(f for f in DEMO_FAMILIES if f not in AUDIO_DEMO_FAMILIES)
DEMO_MODEL_SIZES = ("tiny", "bench")
DEFAULT_FAMILY = "llava"


def make_demo_model(
    out_dir: Path,
    family: str = DEFAULT_FAMILY,
    seed: int = 0,
    size: str = "tiny",
    progress: Progress | None = None,
) -> Path:
    """Writes a seeded random-weight checkpoint of `family` to `out_dir`; returns it."""
    if family not in DEMO_FAMILIES:
        raise ValueError(f"unknown demo family {family!r}; choose from {', '.join(DEMO_FAMILIES)}")
    module_name, _, variant = DEMO_FAMILIES[family].partition(":")
    build = importlib.import_module(module_name).make_demo_model
    extra = {"variant": variant} if variant else {}
    return build(Path(out_dir), seed=seed, size=size, progress=progress, **extra)


__all__ = [
    "AUDIO_DEMO_FAMILIES",
    "DEFAULT_FAMILY",
    "DEMO_FAMILIES",
    "DEMO_MODEL_SIZES",
    "IMAGE_DEMO_FAMILIES",
    "make_demo_model",
]
