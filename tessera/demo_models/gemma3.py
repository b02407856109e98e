"""Demo Gemma 3 checkpoints (`Gemma3ForConditionalGeneration`): SigLIP vision tower pooled
to a fixed number of rows per image, Gemma 3 language model alternating sliding-window
and global layers, as google/gemma-3-4b-it.

The chat template writes `<start_of_image>`; the processor replaces it with a blank line,
the begin marker, `mm_tokens_per_image` soft tokens, the end marker and a blank line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessor,
    Gemma3Processor,
    Gemma3TextConfig,
    GenerationConfig,
    PreTrainedTokenizerFast,
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
)

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
START_OF_TURN = "<start_of_turn>"
END_OF_TURN = "<end_of_turn>"
BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
# Trainer special tokens take the first ids: pad=0, eos=1, bos=2 as in the real tokenizer.
SPECIAL_TOKENS = [
    PAD_TOKEN,
    EOS_TOKEN,
    BOS_TOKEN,
    START_OF_TURN,
    END_OF_TURN,
    BOI_TOKEN,
    EOI_TOKEN,
    IMAGE_TOKEN,
]

# google/gemma-3-4b-it's template: BOS, a system message folded into the first user turn,
# `<start_of_turn>user|model\n ... <end_of_turn>\n`, images as `<start_of_image>`.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    '{%- set first_user_prefix = "" -%}'
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}'
    "{%- endif -%}"
    "{%- if (message['role'] == 'assistant') -%}"
    '{%- set role = "model" -%}'
    "{%- else -%}"
    "{%- set role = message['role'] -%}"
    "{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] | trim }}"
    "{%- elif message['content'] is iterable -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}"
    "{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}"
    "{{ item['text'] | trim }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- else -%}"
    '{{ raise_exception("Invalid content type") }}'
    "{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<start_of_turn>model\\n' }}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of a demo checkpoint: text (Gemma 3) and vision (SigLIP) towers."""

    text: TextSize
    vision: VisionSize
    head_dim: int
    sliding_window: int
    mm_tokens_per_image: int  # a square dividing (image_side / patch_size) ** 2

    @property
    def layer_types(self) -> list[str]:
        """Sliding-window layers with every second one global (the real 5:1, compressed)."""
        return [
            "full_attention" if (i + 1) % 2 == 0 else "sliding_attention"
            for i in range(self.text.layers)
        ]


DEMO_SIZES: dict[str, DemoModelSize] = {
    # A window of 24 tokens is shorter than an image block (16 soft tokens + markers +
    # blank lines) plus a question, so prompts of 60-120 tokens exercise the sliding
    # layers. 4x4 patches, pooling kernel 1.
    "tiny": DemoModelSize(
        TINY_TEXT, TINY_VISION, head_dim=16, sliding_window=24, mm_tokens_per_image=16
    ),
    # 16x16 patches average-pooled 2x2, as the real 64x64 -> 16x16.
    "bench": DemoModelSize(
        BENCH_TEXT, BENCH_VISION, head_dim=64, sliding_window=512, mm_tokens_per_image=64
    ),
}


def build_tokenizer_for_gemma3() -> PreTrainedTokenizerFast:
    """The demo Gemma 3 tokenizer (identical output on every call)."""
    return build_tokenizer(
        SPECIAL_TOKENS,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        # Gemma3Processor reads tokenizer.boi_token / eoi_token / image_token (and their ids).
        extra_special_tokens={
            "boi_token": BOI_TOKEN,
            "eoi_token": EOI_TOKEN,
            "image_token": IMAGE_TOKEN,
        },
    )


def _build_config(spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> Gemma3Config:
    text = Gemma3TextConfig(
        vocab_size=len(tok),
        **spec.text.config_kwargs(),
        head_dim=spec.head_dim,
        query_pre_attn_scalar=spec.head_dim,
        sliding_window=spec.sliding_window,
        layer_types=spec.layer_types,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        bos_token_id=tok.bos_token_id,
        eos_token_id=_stop_ids(tok),
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    vision = SiglipVisionConfig(
        **spec.vision.config_kwargs(),
        vision_use_head=False,
    )
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=spec.mm_tokens_per_image,
        boi_token_index=tok.convert_tokens_to_ids(BOI_TOKEN),
        eoi_token_index=tok.convert_tokens_to_ids(EOI_TOKEN),
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        tie_word_embeddings=False,
        dtype="float32",
    )


def _stop_ids(tok: PreTrainedTokenizerFast) -> list[int]:
    """`<eos>` and `<end_of_turn>` (the usual end of an answer), as the real checkpoint."""
    return [tok.eos_token_id, tok.convert_tokens_to_ids(END_OF_TURN)]


def _generation_config(tok: PreTrainedTokenizerFast) -> GenerationConfig:
    config = greedy_generation_config(tok)
    config.eos_token_id = _stop_ids(tok)
    return config


def build_demo_model(
    seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> tuple[Gemma3ForConditionalGeneration, Gemma3Processor]:
    """Build the seeded demo model and its processor in memory (nothing is saved).

    Same ``seed`` and ``size`` give bit-identical weights; the tokenizer, processor and
    chat template do not depend on the seed.
    """
    spec = check_size(size, DEMO_SIZES)
    say = progress or (lambda _msg: None)

    say("training tokenizer")
    tok = build_tokenizer_for_gemma3()
    tok.model_max_length = spec.text.max_positions

    say(f"building {size} gemma3 model (seed {seed})")
    config = _build_config(spec, tok)
    torch.manual_seed(seed)  # the vision tower keeps the library's default init, seeded here
    model = Gemma3ForConditionalGeneration(config).eval()
    inner = model.model
    stops = _stop_ids(tok)
    embed = inner.language_model.embed_tokens
    reinit_weights(
        embed,
        inner.language_model.layers,
        model.lm_head,
        seed,
        [tid for tid in tok.all_special_ids if tid not in stops],
    )
    with torch.no_grad():
        # Gemma3TextScaledWordEmbedding multiplies by sqrt(hidden): undo it so that token
        # rows enter the residual stream with std 1, like the image rows below.
        embed.weight.div_(embed.scalar_embed_scale)
        # _init_weights zeroes the projection (images would have no effect). Its input is
        # RMS-normalised by mm_soft_emb_norm (weight 0: scale 1 + 0), so a std of
        # 1/sqrt(vision width) gives image rows of std 1.
        projection = inner.multi_modal_projector.mm_input_projection_weight
        gen = torch.Generator().manual_seed(seed + 0x6D6D)
        projection.normal_(0.0, 1.0 / math.sqrt(projection.shape[0]), generator=gen)
    model.generation_config = _generation_config(tok)

    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessor(
            size={"height": spec.vision.image_side, "width": spec.vision.image_side},
            do_pan_and_scan=False,
        ),
        tokenizer=tok,
        chat_template=CHAT_TEMPLATE,
        image_seq_length=spec.mm_tokens_per_image,
    )
    return model, processor


def make_demo_model(
    out_dir: Path, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> Path:
    """Write a seeded random-weight Gemma 3 checkpoint to ``out_dir`` and return it."""
    model, processor = build_demo_model(seed=seed, size=size, progress=progress)
    return save_checkpoint(model, processor, out_dir, progress or (lambda _msg: None))
