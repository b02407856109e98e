"""Demo LLaVA-OneVision checkpoints (`LlavaOnevisionForConditionalGeneration`): SigLIP
vision tower, two-layer projector, Qwen2 language model, as llava-onevision-qwen2-*-hf.

An image alone in its prompt is cut into anyres tiles (a base view plus the tiles of the
best grid resolution, capped by "anyres_max_9") with a newline row after each row of
features, so its row count depends on its size; in a prompt with several images each is
the base view plus one newline row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    LlavaOnevisionConfig,
    LlavaOnevisionForConditionalGeneration,
    LlavaOnevisionImageProcessor,
    LlavaOnevisionProcessor,
    LlavaOnevisionVideoProcessor,
    PreTrainedTokenizerFast,
    Qwen2Config,
    SiglipVisionConfig,
)

from tessera.demo_models.common import (
    BENCH_TEXT,
    BENCH_VISION,
    TINY_TEXT,
    TINY_VISION,
    Progress,
    TextSize,
    VisionSize,
    build_tokenizer,
    check_size,
    greedy_generation_config,
    reinit_weights,
    save_checkpoint,
    silent_ids,
    text_config_kwargs,
)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
IMAGE_TOKEN = "<image>"
VIDEO_TOKEN = "<video>"
# Trainer special tokens take the first ids: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2, ...
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, EOS_TOKEN, IMAGE_TOKEN, VIDEO_TOKEN]
VISION_ASPECT_RATIO = "anyres_max_9"
# SigLIP normalisation, as the real checkpoints' preprocessor configs.
SIGLIP_MEAN = [0.5, 0.5, 0.5]
SIGLIP_STD = [0.5, 0.5, 0.5]

# The template of llava-hf/llava-onevision-qwen2-0.5b-ov-hf (`<|im_start|>role `, images,
# videos, then each text part after a newline, `<|im_end|>` with no newline), plus string
# content. `{% generation %}` parses: transformers renders with its AssistantTracker.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + ' '}}"
    "{% if message['content'] is string %}"
    "{% if message['role'] != 'assistant' %}{{ '\\n' + message['content'] }}"
    "{% else %}{% generation %}{{ '\\n' + message['content'] }}{% endgeneration %}{% endif %}"
    "{% else %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\\n' + content['text'] }}{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}"
    "{% endif %}"
    "{% endif %}"
    "{{'<|im_end|>'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of a demo checkpoint: text (Qwen2) and vision (SigLIP) towers, anyres grid."""

    text: TextSize
    vision: VisionSize
    grid_tiles: int  # anyres resolutions: up to grid_tiles x grid_tiles tiles of image_side

    @property
    def base_rows(self) -> int:
        """Rows of one tile (SigLIP has no CLS row; strategy "full" keeps them all)."""
        return self.vision.patches_per_image

    @property
    def grid_pinpoints(self) -> list[list[int]]:
        """(height, width) resolutions, height-major like the real checkpoints' list."""
        sides = [self.vision.image_side * n for n in range(1, self.grid_tiles + 1)]
        return [[h, w] for h in sides for w in sides]


DEMO_SIZES: dict[str, DemoModelSize] = {
    # A 4x4 grid of 56 px tiles lets images over 168 px a side exceed anyres_max_9 and take
    # the model's feature downsampling.
    "tiny": DemoModelSize(TINY_TEXT, TINY_VISION, grid_tiles=4),
    # At most 9 tiles + the base view per image (<= 2608 rows).
    "bench": DemoModelSize(BENCH_TEXT, BENCH_VISION, grid_tiles=3),
}


def build_tokenizer_for_llava_onevision() -> PreTrainedTokenizerFast:
    """The demo Qwen2-style tokenizer: no BOS, EOS `<|im_end|>` (identical on every call)."""
    return build_tokenizer(
        SPECIAL_TOKENS,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        # Exposes `tokenizer.image_token(_id)` / `video_token(_id)`, read by the processor.
        extra_special_tokens={"image_token": IMAGE_TOKEN, "video_token": VIDEO_TOKEN},
    )


def _build_config(spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> LlavaOnevisionConfig:
    text = Qwen2Config(**text_config_kwargs(spec.text, tok))
    vision = SiglipVisionConfig(
        **spec.vision.config_kwargs(),
        vision_use_head=False,
    )
    return LlavaOnevisionConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        video_token_id=tok.convert_tokens_to_ids(VIDEO_TOKEN),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio=VISION_ASPECT_RATIO,
        image_grid_pinpoints=spec.grid_pinpoints,
        tie_word_embeddings=False,
        dtype="float32",
    )


def _build_processor(spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> LlavaOnevisionProcessor:
    side = {"height": spec.vision.image_side, "width": spec.vision.image_side}
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(
            size=side,
            image_grid_pinpoints=spec.grid_pinpoints,
            image_mean=SIGLIP_MEAN,
            image_std=SIGLIP_STD,
        ),
        tokenizer=tok,
        video_processor=LlavaOnevisionVideoProcessor(
            size=side, image_mean=SIGLIP_MEAN, image_std=SIGLIP_STD
        ),
        num_image_tokens=spec.base_rows,
        vision_feature_select_strategy="full",
        vision_aspect_ratio=VISION_ASPECT_RATIO,
        chat_template=CHAT_TEMPLATE,
    )


def build_demo_model(
    seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> tuple[LlavaOnevisionForConditionalGeneration, LlavaOnevisionProcessor]:
    """Build the seeded demo model and its processor in memory (nothing is saved).

    Same ``seed`` and ``size`` give bit-identical weights; the tokenizer, processor and
    chat template do not depend on the seed.
    """
    spec = check_size(size, DEMO_SIZES)
    say = progress or (lambda _msg: None)

    say("training tokenizer")
    tok = build_tokenizer_for_llava_onevision()
    tok.model_max_length = spec.text.max_positions

    say(f"building {size} llava-onevision model (seed {seed})")
    config = _build_config(spec, tok)
    torch.manual_seed(seed)  # the vision tower keeps the library's default init, seeded here
    model = LlavaOnevisionForConditionalGeneration(config).eval()
    inner = model.model
    reinit_weights(
        inner.language_model.embed_tokens,
        [*inner.language_model.layers, inner.multi_modal_projector],
        model.lm_head,
        seed,
        silent_ids(tok),
    )
    with torch.no_grad():
        # The library draws the newline row with std 1/sqrt(hidden); give it the O(1) scale
        # of the re-initialised token embeddings and image rows.
        gen = torch.Generator().manual_seed(seed + 0x6E6C)
        inner.image_newline.normal_(0.0, 1.0, generator=gen)
    model.generation_config = greedy_generation_config(tok)
    return model, _build_processor(spec, tok)


def make_demo_model(
    out_dir: Path, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> Path:
    """Write a seeded random-weight LLaVA-OneVision checkpoint to ``out_dir``; return it."""
    model, processor = build_demo_model(seed=seed, size=size, progress=progress)
    return save_checkpoint(model, processor, out_dir, progress or (lambda _msg: None))
