"""Model families, chosen by `config.architectures` from one registry."""

from __future__ import annotations

from tessera.adapters.base import (
    AttentionRules,
    ItemPlacement,
    LoadOptions,
    MediaInput,
    ModelFamily,
    ModelPart,
    PackedMedia,
)
from tessera.model_files import read_architecture, resolve_model_dir

_REGISTRY: dict[str, str] = {
    "LlavaForConditionalGeneration": "tessera.adapters.llava:LlavaFamily",
    "LlavaOnevisionForConditionalGeneration": (
        "tessera.adapters.llava_onevision:LlavaOnevisionFamily"
    ),
    "Qwen2VLForConditionalGeneration": "tessera.adapters.qwen_vl:QwenVLFamily",
    "Qwen2_5_VLForConditionalGeneration": "tessera.adapters.qwen_vl:Qwen2_5_VLFamily",
    "Qwen3VLForConditionalGeneration": "tessera.adapters.qwen_vl:Qwen3VLFamily",
    "Qwen3VLMoeForConditionalGeneration": "tessera.adapters.qwen_vl:Qwen3VLMoeFamily",
    "Gemma3ForConditionalGeneration": "tessera.adapters.gemma3:Gemma3Family",
    "Qwen2AudioForConditionalGeneration": "tessera.adapters.qwen2_audio:Qwen2AudioFamily",
    "VoxtralForConditionalGeneration": "tessera.adapters.voxtral:VoxtralFamily",
}


def supported_architectures() -> list[str]:
    return sorted(_REGISTRY)


def load_family(model: str, options: LoadOptions, fingerprint: str | None = None) -> ModelFamily:
    """Loads the parts `options.parts` of checkpoint `model` (a directory or hub id)."""
    import importlib

    model_dir = resolve_model_dir(model)
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
