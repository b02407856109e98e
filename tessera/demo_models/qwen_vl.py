"""Demo Qwen2-VL, Qwen2.5-VL and Qwen3-VL checkpoints: dynamic-resolution vision tower,
patch merger, Qwen2/Qwen3 language model with multimodal RoPE, and (Qwen3-VL) deepstack.

One builder serves the four families; `VARIANTS` holds what differs between them (the
classes, the patch size, the chat template, the mrope layout). Images are resized by the
real processor to multiples of ``patch * merge`` within ``[min_pixels, max_pixels]``, so
the number of rows per image depends on its size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from tessera.demo_models.common import (
    Progress,
    build_tokenizer,
    check_size,
    greedy_generation_config,
    reinit_weights,
    save_checkpoint,
    silent_ids,
)
from tessera.demo_models.tool_template import qwen_template

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
# Named extra special tokens: the processors read `tokenizer.image_token` etc. (and their ids).
NAMED_TOKENS = {
    "vision_start_token": VISION_START,
    "vision_end_token": VISION_END,
    "image_token": IMAGE_TOKEN,
    "video_token": VIDEO_TOKEN,
}
# Trainer special tokens take the first ids, in the real vocabulary's order.
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, EOS_TOKEN, *NAMED_TOKENS.values()]

_TEMPLATE_SETS = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
)
_DEFAULT_SYSTEM = (
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
)
_TEMPLATE_BODY = (
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_MESSAGE, _LOOP_END, _TEMPLATE_END = _TEMPLATE_BODY.rpartition("{% endfor %}")
# The Qwen2-VL / Qwen2.5-VL Instruct template (with its default system prompt), verbatim
# without tools; with tools, Qwen2.5's tool parts (tessera/demo_models/tool_template.py).
QWEN2_CHAT_TEMPLATE = qwen_template(
    _TEMPLATE_SETS, _DEFAULT_SYSTEM, _MESSAGE, _TEMPLATE_END, "You are a helpful assistant."
)
# Qwen3-VL-Instruct's renders these messages the same way but adds no system prompt (its
# tool and thinking branches are left out).
QWEN3_CHAT_TEMPLATE = qwen_template(_TEMPLATE_SETS, "", _MESSAGE, _TEMPLATE_END, "")

MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
VISION_MLP_RATIO = 4
MIN_IMAGE_TOKENS = 4  # min_pixels = 4 * (patch * merge)^2, as in the real checkpoints
# Qwen3-VL's video `size` bounds frames * height * width; the real checkpoint budgets 32 frames.
QWEN3_VIDEO_FRAMES = 32
MOE_EXPERTS_PER_TOKEN = 2


_QWEN2_MROPE = {8: (2, 3, 3), 64: (16, 24, 24)}
_QWEN3_MROPE = {8: (3, 3, 2), 64: (24, 20, 20)}


@dataclass(frozen=True)
class Variant:
    """What differs between the three Qwen-VL families (defaults: Qwen2-VL's)."""

    model_class: type
    processor_class: type
    video_processor_class: type = Qwen2VLVideoProcessor
    patch_size: int = 14
    chat_template: str = QWEN2_CHAT_TEMPLATE
    # (temporal, height, width) rotary pairs keyed by head_dim // 2, in the real proportions.
    mrope_sections: dict[int, tuple[int, int, int]] = field(default_factory=lambda: _QWEN2_MROPE)
    pixel_norm: float | None = None  # image mean and std per channel (None: CLIP's)


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of a Qwen-VL demo checkpoint: text model, vision tower, image resolution."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    max_positions: int
    rope_theta: float
    vision_hidden: int  # Qwen2-VL's tower is as wide as the text model instead
    vision_layers: int  # Qwen2.5-VL: the last one has full attention, the rest windows
    vision_heads: int
    deepstack_levels: tuple[int, ...]  # Qwen3-VL
    position_embeddings: int  # Qwen3-VL, a perfect square
    max_image_tokens: int  # max_pixels = this * (patch * merge)^2; video frames: a quarter
    moe_experts: int  # Qwen3-VL-MoE: experts per layer (2 active per token)
    moe_intermediate: int  # Qwen3-VL-MoE: each expert's MLP width

    @property
    def head_dim(self) -> int:
        return self.text_hidden // self.text_heads


DEMO_SIZES: dict[str, DemoModelSize] = {
    # Milliseconds per step on CPU, 4 to 64 rows per image: for unit tests.
    "tiny": DemoModelSize(
        text_hidden=64,
        text_layers=2,
        text_heads=4,
        text_kv_heads=2,
        text_intermediate=128,
        max_positions=2048,
        rope_theta=10_000.0,  # with head_dim 16, a real theta leaves most pairs near-static
        vision_hidden=32,
        vision_layers=2,
        vision_heads=2,
        deepstack_levels=(0, 1),
        position_embeddings=256,
        max_image_tokens=64,
        moe_experts=4,
        moe_intermediate=64,
    ),
    # Real proportions (head_dim 128, the real mrope sections), ~50 to 2500 rows per image
    # of 200 to 1500 px: for benchmarks. The context holds four of the largest images.
    "bench": DemoModelSize(
        text_hidden=512,
        text_layers=4,
        text_heads=4,
        text_kv_heads=2,
        text_intermediate=1536,
        max_positions=16384,
        rope_theta=1_000_000.0,
        vision_hidden=512,
        vision_layers=4,
        vision_heads=8,
        deepstack_levels=(1, 2, 3),
        position_embeddings=2304,
        max_image_tokens=2500,
        moe_experts=8,
        moe_intermediate=512,
    ),
}

_QWEN3 = Variant(
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
    patch_size=16,
    chat_template=QWEN3_CHAT_TEMPLATE,
    mrope_sections=_QWEN3_MROPE,
    pixel_norm=0.5,
)
VARIANTS: dict[str, Variant] = {
    "qwen2-vl": Variant(Qwen2VLForConditionalGeneration, Qwen2VLProcessor),
    "qwen2.5-vl": Variant(Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor),
    "qwen3-vl": _QWEN3,
    # The same vision tower and processor, a mixture-of-experts language model.
    "qwen3-vl-moe": replace(_QWEN3, model_class=Qwen3VLMoeForConditionalGeneration),
}


def build_qwen_tokenizer(variant: Variant, max_length: int = 2048) -> PreTrainedTokenizerFast:
    """The demo tokenizer of `variant` (identical output on every call; Qwen has no BOS)."""
    return build_tokenizer(
        SPECIAL_TOKENS,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=variant.chat_template,
        extra_special_tokens=NAMED_TOKENS,
        max_length=max_length,
    )


def _build_config(name: str, spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> Any:
    variant = VARIANTS[name]
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": spec.rope_theta,
        "mrope_section": list(variant.mrope_sections[spec.head_dim // 2]),
    }
    text: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": spec.text_hidden,
        "intermediate_size": spec.text_intermediate,
        "num_hidden_layers": spec.text_layers,
        "num_attention_heads": spec.text_heads,
        "num_key_value_heads": spec.text_kv_heads,
        "max_position_embeddings": spec.max_positions,
        "rope_parameters": rope,
        "bos_token_id": None,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    vision: dict[str, Any] = {
        "depth": spec.vision_layers,
        "num_heads": spec.vision_heads,
        "patch_size": variant.patch_size,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }
    if name == "qwen2-vl":  # embed_dim: the tower's width; hidden_size: the merger's output
        width = spec.text_hidden
        vision |= {"embed_dim": width, "hidden_size": width, "mlp_ratio": VISION_MLP_RATIO}
    else:
        vision |= {
            "hidden_size": spec.vision_hidden,
            "intermediate_size": VISION_MLP_RATIO * spec.vision_hidden,
            "out_hidden_size": spec.text_hidden,
        }
    if name == "qwen2.5-vl":  # window attention but in the last block
        vision |= {"window_size": 112, "fullatt_block_indexes": [spec.vision_layers - 1]}
    if name == "qwen3-vl-moe":  # every layer sparse
        text |= {
            "num_experts": spec.moe_experts,
            "num_experts_per_tok": MOE_EXPERTS_PER_TOKEN,
            "moe_intermediate_size": spec.moe_intermediate,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    if name.startswith("qwen3-vl"):
        text["head_dim"] = spec.head_dim
        rope["mrope_interleaved"] = True
        vision |= {
            "num_position_embeddings": spec.position_embeddings,
            "deepstack_visual_indexes": list(spec.deepstack_levels),
        }
    return variant.model_class.config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        video_token_id=tok.convert_tokens_to_ids(VIDEO_TOKEN),
        vision_start_token_id=tok.convert_tokens_to_ids(VISION_START),
        vision_end_token_id=tok.convert_tokens_to_ids(VISION_END),
        tie_word_embeddings=False,
        dtype="float32",
    )


def _build_processor(variant: Variant, spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> Any:
    """The real processor: fast image processor, video processor, tokenizer, template."""
    unit = (variant.patch_size * MERGE_SIZE) ** 2  # pixels per row
    common: dict[str, Any] = {
        "patch_size": variant.patch_size,
        "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }
    if variant.pixel_norm is not None:
        common |= {"image_mean": [variant.pixel_norm] * 3, "image_std": [variant.pixel_norm] * 3}
    min_pixels = MIN_IMAGE_TOKENS * unit
    # Transformers 5 takes the pixel limits as `size` (min_pixels/max_pixels are aliases).
    image_size = {"shortest_edge": min_pixels, "longest_edge": spec.max_image_tokens * unit}
    video_max = spec.max_image_tokens // 4 * unit  # per frame
    if variant.video_processor_class is Qwen3VLVideoProcessor:
        video_max *= QWEN3_VIDEO_FRAMES  # a budget for all frames together
    video_size = {"shortest_edge": min_pixels, "longest_edge": video_max}
    return variant.processor_class(
        image_processor=Qwen2VLImageProcessor(size=image_size, **common),
        tokenizer=tok,
        video_processor=variant.video_processor_class(size=video_size, **common),
        chat_template=variant.chat_template,
    )


def build_demo_model(
    variant: str, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> tuple[Any, Any]:
    """Build the seeded demo model of `variant` (a key of `VARIANTS`) and its processor in
    memory (nothing is saved).

    Same ``seed`` and ``size`` give bit-identical weights; the tokenizer, processor and
    chat template do not depend on the seed.
    """
    family = VARIANTS[variant]
    spec: DemoModelSize = check_size(size, DEMO_SIZES)
    say = progress or (lambda _msg: None)

    say("training tokenizer")
    tok = build_qwen_tokenizer(family, max_length=spec.max_positions)

    say(f"building {size} {variant} model (seed {seed})")
    config = _build_config(variant, spec, tok)
    torch.manual_seed(seed)  # the vision tower keeps the library's default init, seeded here
    model = family.model_class(config).eval()
    visual = model.model.visual
    projectors = [visual.merger, *getattr(visual, "deepstack_merger_list", [])]
    reinit_weights(
        model.model.language_model.embed_tokens,
        [*model.model.language_model.layers, *projectors],
        model.lm_head,
        seed,
        silent_ids(tok),
    )
    _reinit_experts(model.model.language_model, seed)
    model.generation_config = greedy_generation_config(tok)
    return model, _build_processor(family, spec, tok)


@torch.no_grad()
def _reinit_experts(language_model: torch.nn.Module, seed: int) -> None:
    """Mixture-of-experts weights are 3-D parameters, not Linear layers: give them the same
    fan-in-scaled normals, and the router too (its library init, std 0.02, makes routing
    nearly uniform, so which experts a token gets hardly depends on the token)."""
    gen = torch.Generator().manual_seed(seed + 1)
    for module in language_model.modules():
        experts = getattr(module, "experts", None)
        router = getattr(module, "gate", None)
        if experts is None or not hasattr(experts, "gate_up_proj"):
            continue
        for weight in (experts.gate_up_proj, experts.down_proj, router.weight):
            weight.normal_(0.0, weight.shape[-1] ** -0.5, generator=gen)


def make_demo_model(
    out_dir: Path,
    seed: int = 0,
    size: str = "tiny",
    progress: Progress | None = None,
    variant: str = "qwen2-vl",
) -> Path:
    """Write a seeded random-weight `variant` checkpoint to ``out_dir`` and return it."""
    model, processor = build_demo_model(variant, seed=seed, size=size, progress=progress)
    return save_checkpoint(model, processor, out_dir, progress or (lambda _msg: None))
