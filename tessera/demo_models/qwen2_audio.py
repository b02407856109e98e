"""Demo Qwen2-Audio checkpoints (`Qwen2AudioForConditionalGeneration`): a Whisper-style
audio encoder over 128-bin log-mel features of a 30 s window, a linear projector and a
Qwen2 language model, with the real feature extractor, processor and chat template (the
processor's own, which the Instruct checkpoint ships too).

The encoder keeps its real input length (3000 frames, 1500 positions) because the model
checks it; only its width and depth are tiny.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2AudioConfig,
    Qwen2AudioEncoderConfig,
    Qwen2AudioForConditionalGeneration,
    Qwen2AudioProcessor,
    Qwen2Config,
    WhisperFeatureExtractor,
)

from tessera.demo_models.common import (
    BENCH_TEXT,
    TINY_TEXT,
    Progress,
    TextSize,
    build_tokenizer,
    check_size,
    greedy_generation_config,
    reinit_audio_encoder,
    reinit_weights,
    save_checkpoint,
    silent_ids,
    text_config_kwargs,
)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
AUDIO_TOKEN = "<|AUDIO|>"
AUDIO_BOS = "<|audio_bos|>"
AUDIO_EOS = "<|audio_eos|>"
# Named extra special tokens: the processor reads `tokenizer.audio_token` etc.
NAMED_TOKENS = {
    "audio_token": AUDIO_TOKEN,
    "audio_bos_token": AUDIO_BOS,
    "audio_eos_token": AUDIO_EOS,
}
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, EOS_TOKEN, *NAMED_TOKENS.values()]
NUM_MEL_BINS = 128
# The encoder's positions: 3000 mel frames after its stride-2 convolution.
MAX_SOURCE_POSITIONS = 1500


@dataclass(frozen=True)
class AudioEncoderSize:
    d_model: int
    layers: int
    heads: int
    ffn_dim: int


@dataclass(frozen=True)
class DemoModelSize:
    text: TextSize
    audio: AudioEncoderSize


DEMO_SIZES: dict[str, DemoModelSize] = {
    "tiny": DemoModelSize(TINY_TEXT, AudioEncoderSize(d_model=32, layers=2, heads=2, ffn_dim=64)),
    "bench": DemoModelSize(
        BENCH_TEXT, AudioEncoderSize(d_model=256, layers=4, heads=4, ffn_dim=1024)
    ),
}


def build_tokenizer_for_qwen2_audio() -> PreTrainedTokenizerFast:
    return build_tokenizer(
        SPECIAL_TOKENS,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        # The processor's default template (a ChatML conversation, "Audio k:" before each clip).
        chat_template=Qwen2AudioProcessor.default_chat_template.fget(None),
        extra_special_tokens=NAMED_TOKENS,
    )


def _build_config(spec: DemoModelSize, tok: PreTrainedTokenizerFast) -> Qwen2AudioConfig:
    text = Qwen2Config(**text_config_kwargs(spec.text, tok))
    audio = Qwen2AudioEncoderConfig(
        num_mel_bins=NUM_MEL_BINS,
        d_model=spec.audio.d_model,
        encoder_layers=spec.audio.layers,
        encoder_attention_heads=spec.audio.heads,
        encoder_ffn_dim=spec.audio.ffn_dim,
        max_source_positions=MAX_SOURCE_POSITIONS,
    )
    return Qwen2AudioConfig(
        audio_config=audio,
        text_config=text,
        audio_token_index=tok.convert_tokens_to_ids(AUDIO_TOKEN),
        dtype="float32",
    )


def build_demo_model(
    seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> tuple[Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor]:
    spec = check_size(size, DEMO_SIZES)
    say = progress or (lambda _msg: None)
    say("training tokenizer")
    tok = build_tokenizer_for_qwen2_audio()
    tok.model_max_length = spec.text.max_positions
    say(f"building {size} qwen2-audio model (seed {seed})")
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(_build_config(spec, tok)).eval()
    reinit_weights(
        model.model.language_model.embed_tokens,
        [*model.model.language_model.layers, model.model.multi_modal_projector],
        model.lm_head,
        seed,
        silent_ids(tok),
    )
    reinit_audio_encoder(model.model.audio_tower, seed)
    model.generation_config = greedy_generation_config(tok)
    processor = Qwen2AudioProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=NUM_MEL_BINS),
        tokenizer=tok,
        chat_template=tok.chat_template,
    )
    return model, processor


def make_demo_model(
    out_dir: Path, seed: int = 0, size: str = "tiny", progress: Progress | None = None
) -> Path:
    """Write a seeded random-weight Qwen2-Audio checkpoint to ``out_dir`` and return it."""
    model, processor = build_demo_model(seed=seed, size=size, progress=progress)
    return save_checkpoint(model, processor, out_dir, progress or (lambda _msg: None))
