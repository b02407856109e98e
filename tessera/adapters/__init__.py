"""Model families, chosen by `config.architectures` from one registry."""

from __future__ import annotations

from dataclasses import replace

import torch

from tessera.adapters.base import (
    AttentionRules,
    ItemPlacement,
    LoadOptions,
    MediaInput,
    ModelFamily,
    ModelPart,
    PackedMedia,
)
from tessera.architectures import FAMILY_CLASSES as _REGISTRY
from tessera.architectures import supported_architectures
from tessera.model_files import checkpoint_dtype, read_architecture, resolve_model_dir
from tessera.startup_flags import resolve_dtype


def load_family(model: str, options: LoadOptions, fingerprint: str | None = None) -> ModelFamily:
    """Loads the parts `options.parts` of checkpoint `model` (a directory or hub id)."""
    import importlib

    model_dir = resolve_model_dir(model)
    if isinstance(options.dtype, str):
        name = resolve_dtype(options.dtype, checkpoint_dtype(model_dir), options.device)
        options = replace(options, dtype=getattr(torch, name))
    architecture = read_architecture(model_dir)
    if architecture not in _REGISTRY:
        raise ValueError(
            f"{model}: architecture {architecture} is not supported; "
            f"supported: {', '.join(supported_architectures())}"
        )
    module_name, class_name = _REGISTRY[architecture].split(":")
    family_class = getattr(importlib.import_module(module_name), class_name)
    return family_class(model_dir, options, fingerprint=fingerprint)


__all__ = [
    "AttentionRules",
    "ItemPlacement",
    "LoadOptions",
    "MediaInput",
    "ModelFamily",
    "ModelPart",
    "PackedMedia",
    "load_family",
    "supported_architectures",
]
