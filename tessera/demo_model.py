"""Offline random-weight LLaVA checkpoints for tests, demos and benchmarks.

Real checkpoints cannot be downloaded here, so :func:`make_demo_model` builds a
complete ``LlavaForConditionalGeneration`` checkpoint from nothing: a byte-level
BPE tokenizer trained on a generated corpus, a CLIP image processor, a chat
template, seeded random weights and a greedy generation config.  The result is
written with ``save_pretrained`` and reloads with ``from_pretrained`` /
``AutoProcessor.from_pretrained`` like any Hub checkpoint.

The weights are random but not degenerate: they are re-initialised with
fan-in-scaled normals so that activations stay O(1), which makes greedy output
depend on the image content and on where the image rows sit in the sequence.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
)

IMAGE_TOKEN = "<image>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Trainer special tokens take the first ids, so these ids are stable: pad=0, bos=1, ...
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, IMAGE_TOKEN, *ROLE_TOKENS]
TOKENIZER_VOCAB_SIZE = 1536
# Std of the random logits; large enough that top-1/top-2 near-ties are rare.
LOGIT_SCALE = 4.0

# Each message: role marker, newline, content, eos.  An image part renders as the
# image token, which the processor then expands to one token per image row.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] -%}"
    "{{- raise_exception('unsupported role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '" + IMAGE_TOKEN + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- eos_token + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

_WORD_TEXT = (
    "the a an this that these those some every each no one two three four five six "
    "seven eight nine ten many few all red green blue yellow black white gray dark "
    "bright small large tall short round square old new quick slow happy sad quiet "
    "loud warm cold soft hard cat dog bird fish horse cow tree flower river lake sea "
    "mountain hill road car bus train boat plane house room door window table chair "
    "bed cup plate book picture image photo screen sky sun moon star cloud rain snow "
    "wind light shadow color shape line circle box man woman child person people "
    "friend teacher doctor city town park garden street field forest beach is are was "
    "were has have had sees shows holds sits stands runs walks flies swims looks "
    "contains describes appears seems near under over behind above below beside in on "
    "at with without from to of for and or but not very also there here what where "
    "who how why which when describe tell explain answer question left right top "
    "bottom middle center front back side pixel noise pattern texture edge corner"
)
_WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class DemoModelSize:
    """Shape of a demo checkpoint: text (Llama) and vision (CLIP) towers."""

    text_hidden: int
    text_layers: int
    text_heads: int
    text_kv_heads: int
    text_intermediate: int
    max_positions: int
    vision_hidden: int
    vision_layers: int
    vision_heads: int
    vision_intermediate: int
    image_side: int
    patch_size: int

    @property
    def image_rows(self) -> int:
        """Tokens one ``<image>`` expands to (CLS dropped: strategy "default")."""
        return (self.image_side // self.patch_size) ** 2


DEMO_SIZES: dict[str, DemoModelSize] = {
    # Milliseconds per step on CPU: for unit tests.
    "tiny": DemoModelSize(
        text_hidden=64,
        text_layers=2,
        text_heads=4,
        text_kv_heads=2,
        text_intermediate=128,
        max_positions=2048,
        # Vision width differs from text width so a missing projector shows up as a shape error.
        vision_hidden=32,
        vision_layers=2,
        vision_heads=2,
        vision_intermediate=64,
        image_side=56,
        patch_size=14,
    ),
    # Big enough that encoding, prefill and RPC costs are measurable: for benchmarks.
    "bench": DemoModelSize(
        text_hidden=512,
        text_layers=4,
        text_heads=8,
        text_kv_heads=4,
        text_intermediate=1536,
        max_positions=4096,
        vision_hidden=512,
        vision_layers=4,
        vision_heads=8,
        vision_intermediate=2048,
        image_side=224,
        patch_size=14,
    ),
}


def _corpus(n_sentences: int = 3000) -> list[str]:
    """English-ish sentences from a fixed word list with a fixed RNG (not the model seed)."""
    rng = random.Random(1234)
    lines = []
    for _ in range(n_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice(".?!,;:"))
    return lines


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer (identical output on every call)."""
    tok = Tokenizer(models.BPE())
    # No prefix space and no post-processor: the chat template adds <s> itself,
    # so encoding rendered chat text must not add a second one.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        # Named extra special token: exposes `tokenizer.image_token`, which LlavaProcessor reads.
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    fast.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN, *ROLE_TOKENS]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _build_config(spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> LlavaConfig:
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.text_hidden,
        intermediate_size=spec.text_intermediate,
        num_hidden_layers=spec.text_layers,
        num_attention_heads=spec.text_heads,
        num_key_value_heads=spec.text_kv_heads,
        max_position_embeddings=spec.max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    vision = CLIPVisionConfig(
        hidden_size=spec.vision_hidden,
        intermediate_size=spec.vision_intermediate,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        image_size=spec.image_side,
        patch_size=spec.patch_size,
        projection_dim=spec.vision_hidden,
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=spec.image_rows,
        vision_feature_select_strategy="default",
        dtype="float32",
    )


@torch.no_grad()
def _reinit(model: LlavaForConditionalGeneration, seed: int, special_ids: list[int]) -> None:
    """Give the text model and projector fan-in-scaled weights.

    The library default (normal, std 0.02) leaves every residual update tiny
    next to the embeddings and the logits nearly flat, so greedy decoding emits
    one token whatever the input.  With std 1/sqrt(fan_in) each layer keeps
    activations O(1): attention mixes image rows into the last position, RoPE
    makes that mix position-dependent, and the logits (std ~LOGIT_SCALE) rarely
    tie.  The projector gets the same treatment so image rows are as large as
    token embeddings.  The vision tower keeps its default init: its
    pre-layernorm already normalises the patch embeddings.
    """
    gen = torch.Generator().manual_seed(seed)
    lm = model.model.language_model
    lm.embed_tokens.weight.normal_(0.0, 1.0, generator=gen)
    modules = [*lm.layers, model.model.multi_modal_projector]
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear):
                sub.weight.normal_(0.0, 1.0 / math.sqrt(sub.in_features), generator=gen)
    head = model.lm_head.weight
    head.normal_(0.0, LOGIT_SCALE / math.sqrt(head.shape[1]), generator=gen)
    # A zero row gives logit 0, far below the usual top logit (~3 * LOGIT_SCALE), so
    # greedy decoding never emits pad, bos, <image> or role markers: generated text
    # re-tokenizes without stray image placeholders.  eos keeps a random row so
    # generation can still end on its own, rarely.
    head[[tid for tid in special_ids if tid != model.config.text_config.eos_token_id]] = 0.0


def build_demo_model(
    seed: int = 0,
    size: str = "tiny",
    progress: Callable[[str], None] | None = None,
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """Build the seeded demo model and its processor in memory (nothing is saved).

    Same ``seed`` and ``size`` give bit-identical weights; the tokenizer,
    processor and chat template do not depend on the seed.
    """
    if size not in DEMO_SIZES:
        raise ValueError(f"unknown demo model size {size!r}; choose from {sorted(DEMO_SIZES)}")
    spec = DEMO_SIZES[size]
    say = progress or (lambda _msg: None)

    say("training tokenizer")
    tok = build_tokenizer()
    tok.model_max_length = spec.max_positions

    say(f"building {size} model (seed {seed})")
    config = _build_config(spec, tok)
    torch.manual_seed(seed)  # the vision tower keeps the library's default init, seeded here
    model = LlavaForConditionalGeneration(config).eval()
    _reinit(model, seed, tok.all_special_ids)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )

    side = {"height": spec.image_side, "width": spec.image_side}
    processor = LlavaProcessor(
        # The PIL variant explicitly: the default one needs torchvision, unusable here.
        # It saves as "CLIPImageProcessor", so AutoProcessor picks whichever variant exists.
        image_processor=CLIPImageProcessorPil(
            size={"shortest_edge": spec.image_side}, crop_size=side
        ),
        tokenizer=tok,
        patch_size=spec.patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # the CLS row, dropped by the "default" strategy
        chat_template=CHAT_TEMPLATE,
    )
    return model, processor


def make_demo_model(
    out_dir: Path,
    seed: int = 0,
    size: str = "tiny",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write a seeded random-weight LLaVA checkpoint to ``out_dir`` and return it.

    The directory holds the model, generation config, processor, tokenizer and
    chat template; ``LlavaForConditionalGeneration.from_pretrained(out_dir)``
    and ``AutoProcessor.from_pretrained(out_dir)`` reload it exactly.
    """
    model, processor = build_demo_model(seed=seed, size=size, progress=progress)
    out_dir = Path(out_dir)
    say = progress or (lambda _msg: None)
    say(f"saving to {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    say("done")
    return out_dir
