"""LLaVA (`LlavaForConditionalGeneration`): CLIP-style vision tower + projector, Llama-style
language model, a fixed number of rows per image."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoProcessor, LlavaForConditionalGeneration

from tessera.adapters.base import ChatMessageDict, KVShape, LoadOptions, ModelPart
from tessera.hashing import model_fingerprint
from tessera.media import DecodedImage
from tessera.placeholders import Modality, PlaceholderRange


class PartNotLoadedError(RuntimeError):
    pass


class LlavaFamily:
    """LLaVA-1.5 style checkpoints."""

    name = "llava"
    architectures = ("LlavaForConditionalGeneration",)

    def __init__(self, model_dir: Path, options: LoadOptions, fingerprint: str | None = None):
        self.model_dir = model_dir
        self.fingerprint = fingerprint or model_fingerprint(model_dir)
        self.device = torch.device(options.device)
        self.dtype = options.dtype
        self._processor = AutoProcessor.from_pretrained(model_dir)
        self._tokenizer = self._processor.tokenizer
        if self._tokenizer.chat_template is None and self._processor.chat_template is None:
            raise ValueError(f"{model_dir} has no chat template; add one to the tokenizer")
        self._model = self._load_model(model_dir, options)
        config = self._config = self._model.config if self._model else _load_config(model_dir)
        self.modalities = frozenset({Modality.IMAGE})
        self.placeholder_token_ids = {Modality.IMAGE: int(config.image_token_id)}
        self.hidden_size = int(config.text_config.hidden_size)
        self.vocab_size = int(config.text_config.vocab_size)
        self.max_model_len = int(config.text_config.max_position_embeddings)
        self.eos_token_ids = _eos_token_ids(model_dir, self._tokenizer)

    @staticmethod
    def _load_model(model_dir: Path, options: LoadOptions) -> LlavaForConditionalGeneration | None:
        wanted = options.parts & (ModelPart.MEDIA_ENCODER | ModelPart.LANGUAGE_MODEL)
        if not wanted:
            return None
        attention = None
        if options.text_attention:
            attention = {"text_config": options.text_attention, "vision_config": "sdpa", "": "sdpa"}
        model = LlavaForConditionalGeneration.from_pretrained(
            model_dir, dtype=options.dtype, attn_implementation=attention
        )
        # Drop what this process will never run, so its memory is returned.
        if ModelPart.MEDIA_ENCODER not in options.parts:
            model.model.vision_tower = None
            model.model.multi_modal_projector = None
        if ModelPart.LANGUAGE_MODEL not in options.parts:
            model.model.language_model = None
            model.lm_head = None
        return model.to(options.device).eval()

    # -- processor side -------------------------------------------------------------

    def render_prompt(self, messages: Sequence[ChatMessageDict]) -> list[int]:
        text = self._processor.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=False
        )
        # The template writes every special token itself (as vLLM's chat path assumes).
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def num_placeholder_rows(self, item: DecodedImage) -> int:
        counts = self._processor._get_num_multimodal_tokens(image_sizes=[(item.height, item.width)])
        return int(counts["num_image_tokens"][0])

    def decode_tokens(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # -- media encoder side --------------------------------------------------------------

    @torch.inference_mode()
    def encode(self, items: Sequence[DecodedImage]) -> list[torch.Tensor]:
        self._require(self._model and self._model.model.vision_tower, "media encoder")
        pixel_values = self._processor.image_processor(
            [item.image for item in items], return_tensors="pt"
        )["pixel_values"].to(self.device, self.dtype)
        config = self._config
        features = self._model.model.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
        ).pooler_output
        return [rows.to(self.dtype) for rows in features]

    # -- language model side ----------------------------------------------------------

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        self._language_model()
        return self._model.get_input_embeddings()(token_ids.to(self.device))

    def positions(
        self, num_prompt_tokens: int, ranges: Sequence[PlaceholderRange], start: int, end: int
    ) -> torch.Tensor:
        # LLaVA uses plain 1-D positions: an image row is one ordinary position.
        return torch.arange(start, end, device=self.device).unsqueeze(0)

    def kv_shape(self) -> KVShape:
        text = self._config.text_config
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return KVShape(text.num_hidden_layers, text.num_key_value_heads, head_dim)

    @torch.inference_mode()
    def forward(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **attention_kwargs: Any
    ) -> torch.Tensor:
        output = self._language_model()(
            inputs_embeds=inputs_embeds.unsqueeze(0),
            position_ids=position_ids,
            use_cache=False,
            **attention_kwargs,
        )
        return output.last_hidden_state[0]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._language_model()
        return self._model.lm_head(hidden).float()

    # -- helpers -------------------------------------------------------------------------

    def _language_model(self) -> torch.nn.Module:
        return self._require(self._model and self._model.model.language_model, "language model")

    def _require(self, module: Any, what: str) -> Any:
        if module is None:
            raise PartNotLoadedError(f"the {what} of {self.model_dir} was not loaded here")
        return module


def _load_config(model_dir: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


def _eos_token_ids(model_dir: Path, tokenizer: Any) -> tuple[int, ...]:
    """EOS ids from generation_config.json (may be a list), else the tokenizer's."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)
