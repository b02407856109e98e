"""Demo Qwen2.5-VL checkpoints; the builder is shared with the other Qwen-VL families
(`tessera.demo_models.qwen_vl`)."""

from __future__ import annotations

from pathlib import Path

from tessera.demo_models.common import Progress
from tessera.demo_models.qwen_vl import make_qwen_vl_model


def make_demo_model(
    out_dir: Path, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> Path:
    """Write a seeded random-weight Qwen2.5-VL checkpoint to ``out_dir`` and return it."""
    return make_qwen_vl_model("qwen2.5-vl", out_dir, seed=seed, size=size, progress=progress)
