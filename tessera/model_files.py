"""Finding a checkpoint's files: a local directory, or a hub id resolved to its snapshot."""

from __future__ import annotations

import json
from pathlib import Path

# Everything a serving process reads; weights in other formats are not needed.
_SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def resolve_model_dir(model: str) -> Path:
    """A directory holding the checkpoint: `model` itself if it is one, else the local
    snapshot of hub id `model` (downloaded on first use, cached afterwards)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists() or model.startswith((".", "/")):
        raise FileNotFoundError(f"model {model!r} is not a checkpoint directory")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id=model, allow_patterns=_SNAPSHOT_PATTERNS))


def read_architecture(model_dir: Path) -> str:
    """The first entry of config.json's `architectures`."""
    config_path = model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{model_dir} has no config.json; is it a checkpoint?") from None
    architectures = config.get("architectures") or []
    if not architectures:
        raise ValueError(f"{config_path} names no architectures")
    return architectures[0]


def checkpoint_dtype(model_dir: Path) -> str | None:
    """The dtype config.json says the weights are in (`dtype`, or `torch_dtype` in
    checkpoints saved before transformers 4.56; a composite model's may sit in its
    text_config), or None if it names none."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        for key in ("dtype", "torch_dtype"):
            if isinstance(section.get(key), str):
                return section[key].removeprefix("torch.")
    return None
