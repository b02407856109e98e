"""Demo Voxtral checkpoints (`VoxtralForConditionalGeneration`): a Whisper-style audio
encoder over 30 s windows, a two-layer projector and a Llama language model, with the
real `VoxtralProcessor`, whose tokenizer is Mistral's Tekken (mistral-common).

The real checkpoint ships `tekken.json`: byte-level BPE ranks (tiktoken), Mistral's
special tokens (`[AUDIO]` = 24, `[BEGIN_AUDIO]` = 25) and an audio section (16 kHz,
12.5 rows per second, 30 s chunks). The demo writes one of the same shape whose ranks
come from a BPE trained on the demo corpus.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    VoxtralConfig,
    VoxtralEncoderConfig,
    VoxtralForConditionalGeneration,
    VoxtralProcessor,
    WhisperFeatureExtractor,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tessera.demo_models.common import (
    BENCH_TEXT,
    TINY_TEXT,
    TOKENIZER_VOCAB_SIZE,
    Progress,
    TextSize,
    check_size,
    corpus,
    reinit_audio_encoder,
    reinit_weights,
    save_checkpoint,
)

# Mistral's control tokens in their real ranks; the rest up to NUM_SPECIAL_TOKENS are fillers.
SPECIAL_TOKENS = [
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]", "<SPECIAL_20>", "<SPECIAL_21>", "<SPECIAL_22>", "<SPECIAL_23>",
    "[AUDIO]", "[BEGIN_AUDIO]", "[TRANSCRIBE]",
]  # fmt: skip
NUM_SPECIAL_TOKENS = 32
BOS_ID, EOS_ID, PAD_ID, AUDIO_ID = 1, 2, 11, 24
# Tekken's pre-tokenizer pattern (tiktoken `pat_str`), as in Mistral's tekken.json.
PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SAMPLING_RATE = 16_000
NUM_MEL_BINS = 128
CHUNK_SECONDS = 30.0
ROWS_PER_SECOND = 12.5
# The encoder's positions: 3000 mel frames after its stride-2 convolution.
MAX_SOURCE_POSITIONS = 1500
# Encoder positions stacked into one row before the projector (intermediate = 4 * width).
POSITIONS_PER_ROW = 4


@dataclass(frozen=True)
class DemoModelSize:
    text: TextSize
    audio_width: int
    audio_layers: int
    audio_heads: int


DEMO_SIZES: dict[str, DemoModelSize] = {
    "tiny": DemoModelSize(TINY_TEXT, audio_width=32, audio_layers=2, audio_heads=2),
    "bench": DemoModelSize(BENCH_TEXT, audio_width=256, audio_layers=4, audio_heads=4),
}


def tekken_ranks() -> list[bytes]:
    """The 256 bytes, then the merges a byte-level BPE learns from the demo corpus."""
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(corpus(), trainer=trainer)
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks = [bytes([b]) for b in range(256)]
    seen = set(ranks)
    for token, _ in sorted(bpe.get_vocab().items(), key=lambda item: item[1]):
        piece = bytes(to_byte[char] for char in token)
        if piece not in seen:
            seen.add(piece)
            ranks.append(piece)
    return ranks


def tekken_json() -> dict:
    ranks = tekken_ranks()
    specials = SPECIAL_TOKENS + [
        f"<SPECIAL_{i}>" for i in range(len(SPECIAL_TOKENS), NUM_SPECIAL_TOKENS)
    ]
    return {
        "config": {
            "pattern": PATTERN,
            "num_vocab_tokens": len(ranks),
            "default_vocab_size": NUM_SPECIAL_TOKENS + len(ranks),
            "default_num_special_tokens": NUM_SPECIAL_TOKENS,
            "version": "v7",
        },
        "vocab": [
            {"rank": rank, "token_bytes": base64.b64encode(piece).decode(), "token_str": None}
            for rank, piece in enumerate(ranks)
        ],
        "special_tokens": [
            {"rank": rank, "token_str": token, "is_control": True}
            for rank, token in enumerate(specials)
        ],
        "audio": {
            "sampling_rate": SAMPLING_RATE,
            "frame_rate": ROWS_PER_SECOND,
            "audio_encoding_config": {
                "num_mel_bins": NUM_MEL_BINS,
                "hop_length": 160,
                "window_size": 400,
            },
            "chunk_length_s": CHUNK_SECONDS,
        },
    }


def _build_config(spec: DemoModelSize, vocab_size: int) -> VoxtralConfig:
    text = LlamaConfig(
        vocab_size=vocab_size,
        **spec.text.config_kwargs(),
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
    )
    audio = VoxtralEncoderConfig(
        num_mel_bins=NUM_MEL_BINS,
        hidden_size=spec.audio_width,
        intermediate_size=POSITIONS_PER_ROW * spec.audio_width,
        num_hidden_layers=spec.audio_layers,
        num_attention_heads=spec.audio_heads,
        max_source_positions=MAX_SOURCE_POSITIONS,
    )
    return VoxtralConfig(
        audio_config=audio,
        text_config=text,
        audio_token_id=AUDIO_ID,
        projector_hidden_act="gelu",
        dtype="float32",
    )


def make_demo_model(
    out_dir: Path, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> Path:
    """Write a seeded random-weight Voxtral checkpoint to ``out_dir`` and return it."""
    from transformers import GenerationConfig
    from transformers.tokenization_mistral_common import MistralCommonBackend

    spec = check_size(size, DEMO_SIZES)
    say = progress or (lambda _msg: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say("training tokenizer")
    tekken = tekken_json()
    (out_dir / "tekken.json").write_text(json.dumps(tekken))
    tokenizer = MistralCommonBackend.from_pretrained(out_dir)
    say(f"building {size} voxtral model (seed {seed})")
    torch.manual_seed(seed)
    config = _build_config(spec, tekken["config"]["default_vocab_size"])
    model = VoxtralForConditionalGeneration(config).eval()
    reinit_weights(
        model.model.language_model.embed_tokens,
        [*model.model.language_model.layers, model.model.multi_modal_projector],
        model.lm_head,
        seed,
        [i for i in range(NUM_SPECIAL_TOKENS) if i != EOS_ID],
    )
    reinit_audio_encoder(model.model.audio_tower, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False
    )
    processor = VoxtralProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=NUM_MEL_BINS), tokenizer=tokenizer
    )
    return save_checkpoint(model, processor, out_dir, say)
