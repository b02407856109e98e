"""Pieces every demo checkpoint shares: a tokenizer trained offline, seeded weights that
make images matter, a greedy generation config, and saving.

Real checkpoints cannot be downloaded here, so each family's builder makes a complete
checkpoint from nothing with the family's real model and processor classes; the result
is written with ``save_pretrained`` and reloads with ``from_pretrained`` /
``AutoProcessor.from_pretrained`` like any Hub checkpoint.

The weights are random but not degenerate: text layers and projectors get fan-in-scaled
normals so that activations stay O(1), which makes greedy output depend on the image
content and on where the image rows sit in the sequence, and the logits rarely tie.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TextSize:
    """Shape of a demo language model."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int

    def config_kwargs(self) -> dict[str, int]:
        """The sizes as transformers text configs name them."""
        return {
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": self.max_positions,
        }


def text_config_kwargs(size: TextSize, tok: PreTrainedTokenizerFast) -> dict[str, Any]:
    """A demo text config's sizes, vocabulary and special ids (untied head)."""
    return {
        "vocab_size": len(tok),
        **size.config_kwargs(),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "tie_word_embeddings": False,
    }


@dataclass(frozen=True)
class VisionSize:
    """Shape of a demo ViT (CLIP or SigLIP) over square images of `image_side` px."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    image_side: int
    patch_size: int

    @property
    def patches_per_image(self) -> int:
        return (self.image_side // self.patch_size) ** 2

    def config_kwargs(self) -> dict[str, int]:
        """The sizes as transformers vision configs name them."""
        return {
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "image_size": self.image_side,
            "patch_size": self.patch_size,
        }


# Milliseconds per step on CPU: for unit tests. The vision width differs from the text
# width so that a missing projector shows up as a shape error.
TINY_TEXT = TextSize(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_positions=2048)
TINY_VISION = VisionSize(
    hidden=32, layers=2, heads=2, intermediate=64, image_side=56, patch_size=14
)
# Big enough that encoding, prefill and RPC costs are measurable: for benchmarks.
BENCH_TEXT = TextSize(
    hidden=512, layers=4, heads=8, kv_heads=4, intermediate=1536, max_positions=4096
)
BENCH_VISION = VisionSize(
    hidden=512, layers=4, heads=8, intermediate=2048, image_side=224, patch_size=14
)

TOKENIZER_VOCAB_SIZE = 1536
# Std of the random logits; large enough that top-1/top-2 near-ties are rare.
LOGIT_SCALE = 4.0

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


def corpus(num_sentences: int = 3000) -> list[str]:
    """English-ish sentences from a fixed word list with a fixed RNG (not the model seed)."""
    rng = random.Random(1234)
    lines = []
    for _ in range(num_sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        sentence = " ".join(words)
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice(".?!,;:"))
    return lines


def build_tokenizer(
    special_tokens: Sequence[str],
    *,
    bos_token: str | None,
    eos_token: str,
    pad_token: str,
    chat_template: str,
    extra_special_tokens: dict[str, str] | None = None,
    max_length: int = 2048,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the demo corpus (identical on every call).

    `special_tokens` take the first ids in order and stay atomic; no post-processor adds
    BOS, because the chat template writes every special token itself.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    named = {"eos_token": eos_token, "pad_token": pad_token}
    if bos_token is not None:
        named["bos_token"] = bos_token
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, extra_special_tokens=extra_special_tokens or {}, **named
    )
    reserved = set(named.values())
    fast.add_special_tokens(
        {"additional_special_tokens": [t for t in special_tokens if t not in reserved]}
    )
    fast.chat_template = chat_template
    fast.model_max_length = max_length
    return fast


@torch.no_grad()
def reinit_weights(
    embeddings: torch.nn.Embedding,
    modules: Iterable[torch.nn.Module],
    lm_head: torch.nn.Linear,
    seed: int,
    silent_token_ids: Iterable[int],
) -> None:
    """Fan-in-scaled weights for the text model, projectors and head.

    The library default (normal, std 0.02) leaves every residual update tiny next to the
    embeddings and the logits nearly flat, so greedy decoding emits one token whatever
    the input. With std 1/sqrt(fan_in) each layer keeps activations O(1): attention mixes
    image rows into the last position, RoPE makes that mix position-dependent, and the
    logits (std ~LOGIT_SCALE) rarely tie. Tokens in `silent_token_ids` get a zero head
    row (logit 0, far below the usual top logit), so greedy decoding never emits a media
    placeholder or a role marker and generated text re-tokenizes cleanly.
    """
    gen = torch.Generator().manual_seed(seed)
    embeddings.weight.normal_(0.0, 1.0, generator=gen)
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear):
                sub.weight.normal_(0.0, 1.0 / math.sqrt(sub.in_features), generator=gen)
    head = lm_head.weight
    head.normal_(0.0, LOGIT_SCALE / math.sqrt(head.shape[1]), generator=gen)
    head[list(silent_token_ids)] = 0.0


@torch.no_grad()
def reinit_audio_encoder(encoder: torch.nn.Module, seed: int) -> None:
    """Fan-in-scaled convolutions and linear layers for a Whisper-style audio encoder.

    With the library's default init (std 0.02) the convolutions shrink the log-mel
    features far below the positional embeddings they are added to, so every clip
    encodes to nearly the same rows. Scaled weights keep the audio's own signal in the
    rows, so greedy output depends on what the clip holds (the tests check it does).
    """
    gen = torch.Generator().manual_seed(seed + 1)
    for sub in encoder.modules():
        if isinstance(sub, torch.nn.Conv1d):
            fan_in = sub.in_channels * sub.kernel_size[0]
            sub.weight.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        elif isinstance(sub, torch.nn.Linear):
            sub.weight.normal_(0.0, 1.0 / math.sqrt(sub.in_features), generator=gen)


def greedy_generation_config(tok: PreTrainedTokenizerFast) -> GenerationConfig:
    return GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )


def silent_ids(tok: PreTrainedTokenizerFast) -> list[int]:
    """Every special token but EOS (which keeps a random row so generation can end)."""
    return [tid for tid in tok.all_special_ids if tid != tok.eos_token_id]


def save_checkpoint(model: Any, processor: Any, out_dir: Path, say: Progress) -> Path:
    out_dir = Path(out_dir)
    say(f"saving to {out_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    say("done")
    return out_dir


def check_size(size: str, sizes: dict[str, Any]) -> Any:
    if size not in sizes:
        raise ValueError(f"unknown demo model size {size!r}; choose from {sorted(sizes)}")
    return sizes[size]
