"""Demo LLaVA-1.5 checkpoints (`LlavaForConditionalGeneration`): CLIP vision tower,
projector, Llama language model, a fixed number of rows per image."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
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
from tessera.demo_models.tool_template import (
    TOOL_CALLS_JINJA,
    TOOL_RESPONSE_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOLS_SYSTEM_JINJA,
)

IMAGE_TOKEN = "<image>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Trainer special tokens take the first ids, so these ids are stable: pad=0, bos=1, ...
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, IMAGE_TOKEN, *ROLE_TOKENS]

# Each message: role marker, newline, content, eos.  An image part renders as the
# image token, which the processor then expands to one token per image row.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- macro content_text(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}"
    "{%- for part in content -%}"
    "{%- if part['type'] == 'image' -%}{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # With tools, the system turn lists them (after the conversation's own system text).
    "{%- if tools -%}"
    "{{- '<|system|>\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{{- content_text(messages[0]['content']) + '\\n\\n' -}}"
    "{%- endif -%}" + TOOLS_SYSTEM_JINJA + "{{- eos_token + '\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (tools and loop.first and message['role'] == 'system') -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '<|user|>\\n"
    + TOOL_RESPONSE_OPEN
    + "' + content_text(message['content']) + '"
    + TOOL_RESPONSE_CLOSE
    + "' -}}"
    "{%- else -%}"
    "{{- '<|' + message['role'] + '|>\\n' + content_text(message['content']) -}}"
    + TOOL_CALLS_JINJA
    + "{%- endif -%}"
    "{{- eos_token + '\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of a demo checkpoint: text (Llama) and vision (CLIP) towers."""

    text: TextSize
    vision: VisionSize

    @property
    def image_rows(self) -> int:
        """Tokens one ``<image>`` expands to (CLS dropped: strategy "default")."""
        return self.vision.patches_per_image


DEMO_SIZES: dict[str, DemoModelSize] = {
    "tiny": DemoModelSize(TINY_TEXT, TINY_VISION),
    "bench": DemoModelSize(BENCH_TEXT, BENCH_VISION),
}


def build_tokenizer_for_llava() -> PreTrainedTokenizerFast:
    """The demo tokenizer (identical output on every call)."""
    return build_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        # Named extra special token: exposes `tokenizer.image_token`, which LlavaProcessor reads.
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )


def _build_config(spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> LlavaConfig:
    text = LlamaConfig(**text_config_kwargs(spec.text, tok))
    vision = CLIPVisionConfig(
        **spec.vision.config_kwargs(),
        projection_dim=spec.vision.hidden,
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=spec.image_rows,
        vision_feature_select_strategy="default",
        dtype="float32",
    )


def build_demo_model(
    seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """Build the seeded demo model and its processor in memory (nothing is saved).

    Same ``seed`` and ``size`` give bit-identical weights; the tokenizer,
    processor and chat template do not depend on the seed.
    """
    spec = check_size(size, DEMO_SIZES)
    say = progress or (lambda _msg: None)

    say("training tokenizer")
    tok = build_tokenizer_for_llava()
    tok.model_max_length = spec.text.max_positions

    say(f"building {size} llava model (seed {seed})")
    config = _build_config(spec, tok)
    torch.manual_seed(seed)  # the vision tower keeps the library's default init, seeded here
    model = LlavaForConditionalGeneration(config).eval()
    reinit_weights(
        model.model.language_model.embed_tokens,
        [*model.model.language_model.layers, model.model.multi_modal_projector],
        model.lm_head,
        seed,
        silent_ids(tok),
    )
    model.generation_config = greedy_generation_config(tok)

    side = {"height": spec.vision.image_side, "width": spec.vision.image_side}
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": spec.vision.image_side}, crop_size=side
        ),
        tokenizer=tok,
        patch_size=spec.vision.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the CLS row, dropped by the "default" strategy
        chat_template=CHAT_TEMPLATE,
    )
    return model, processor


def make_demo_model(
    out_dir: Path, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> Path:
    """Write a seeded random-weight LLaVA checkpoint to ``out_dir`` and return it."""
    model, processor = build_demo_model(seed=seed, size=size, progress=progress)
    return save_checkpoint(model, processor, out_dir, progress or (lambda _msg: None))
