"""The architectures Tessera serves (config.json's `architectures[0]`) and the family class
of each, as "module:class" names: readable without importing torch or any family, so flags
can be checked (tessera.preflight) before anything heavy loads."""

from __future__ import annotations

FAMILY_CLASSES: dict[str, str] = {
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
    return sorted(FAMILY_CLASSES)
