"""What every transformers-based family shares: loading the processor and the parts of
the model a service runs, the chat template, tokenizing, 1-D positions, the language
model's forward and logits. A family subclasses `HFFamily` and says what differs: its
model class, its media modules, how many rows an item takes and how it is encoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import torch
from PIL import Image
from transformers import AutoConfig, AutoProcessor, GenerationConfig

from tessera.adapters.base import (
    AttentionRules,
    ChatMessageDict,
    ItemPlacement,
    KVShape,
    LoadOptions,
    MediaInput,
    ModelPart,
    PackedMedia,
    PartNotLoadedError,
    ProcessedImage,
)
from tessera.hashing import model_fingerprint
from tessera.linear_choice import apply_linear_kernel
from tessera.linear_kernels import TORCH
from tessera.media import DecodedImage, ProcessingOptions
from tessera.onednn_linear import onednn_applies
from tessera.placeholders import Modality, PlaceholderRange
from tessera.video import FrameSampler


class HFFamily:
    """A multimodal transformers checkpoint `model.model.{<media modules>, language_model}`
    with `model.lm_head`."""

    name: ClassVar[str]
    architectures: ClassVar[tuple[str, ...]]
    # Attributes of `model.model` that only the encoder runs (dropped elsewhere).
    media_modules: ClassVar[tuple[str, ...]]
    renders_token_ids: ClassVar[bool] = False
    attention: ClassVar[AttentionRules] = AttentionRules()
    # Processing options a request may set, with their accepted [min, max] values.
    option_limits: ClassVar[Mapping[str, tuple[int, int]]] = MappingProxyType({})
    # True: `encode` takes images through `_pixel_values`, so one a gateway processed
    # (`ProcessedImage`) can stand for the file, where the processor's shape is fixed.
    takes_processed_pixels: ClassVar[bool] = False

    def __init__(self, model_dir: Path, options: LoadOptions, fingerprint: str | None = None):
        self.model_dir = model_dir
        self.fingerprint = fingerprint or model_fingerprint(model_dir)
        self.device = torch.device(options.device)
        self.dtype = options.dtype
        self._processor = AutoProcessor.from_pretrained(model_dir)
        self._tokenizer = self._processor.tokenizer
        if options.chat_template is not None:
            self._override_chat_template(options.chat_template)
        self._check_chat_template()
        self._model = self._load_model(options)
        self.linear_kernel = self._pack_linears(options)
        config = self._config = self._model.config if self._model else _load_config(model_dir)
        text = config.get_text_config()
        self.placeholder_token_ids = self._placeholder_token_ids()
        self.modalities = frozenset(self.placeholder_token_ids)
        self.hidden_size = int(text.hidden_size)
        self.num_planes = 1
        self.fixed_item_rows: int | None = None
        self.audio_sampling_rate: int | None = None
        self.max_audio_seconds: float | None = None
        self.vocab_size = int(text.vocab_size)
        self.max_model_len = int(text.max_position_embeddings)
        self.max_token_chars = _max_token_chars(self._tokenizer)
        self.eos_token_ids = _eos_token_ids(model_dir, self._tokenizer)
        self.processed_pixels_shape = self._fixed_pixels_shape()

    def _override_chat_template(self, template: str) -> None:
        """--chat-template: apply_chat_template renders with the processor's template."""
        self._processor.chat_template = template

    @property
    def tokenizer(self) -> Any:
        """The processor's tokenizer (the decoder builds grammar masks from it)."""
        return self._tokenizer

    def _check_chat_template(self) -> None:
        if self._tokenizer.chat_template is None and self._processor.chat_template is None:
            raise ValueError(f"{self.model_dir} has no chat template; add one to the tokenizer")

    def _model_class(self) -> type:
        import transformers

        return getattr(transformers, self.architectures[0])

    def _load_model(self, options: LoadOptions) -> Any:
        wanted = options.parts & (ModelPart.MEDIA_ENCODER | ModelPart.LANGUAGE_MODEL)
        if not wanted:
            return None
        attention = None
        if options.text_attention:
            attention = {"text_config": options.text_attention, "vision_config": "sdpa", "": "sdpa"}
        model = self._model_class().from_pretrained(
            self.model_dir, dtype=options.dtype, attn_implementation=attention
        )
        # Drop what this process will never run, so its memory is returned.
        if ModelPart.MEDIA_ENCODER not in options.parts:
            for module in self.media_modules:
                setattr(model.model, module, None)
        if ModelPart.LANGUAGE_MODEL not in options.parts:
            model.model.language_model = None
            model.lm_head = None
        return model.to(options.device).eval()

    def _pack_linears(self, options: LoadOptions) -> str:
        """--linear-kernel: what runs the language model's and lm_head's linears."""
        if ModelPart.LANGUAGE_MODEL not in options.parts:
            return TORCH
        if not onednn_applies(self.device, self.dtype):
            return TORCH
        model = self._model
        roots = [model.model.language_model, model.lm_head]
        return apply_linear_kernel(model, roots, options.linear_kernel)

    def _placeholder_token_ids(self) -> dict[Modality, int]:
        return {Modality.IMAGE: int(self._config.image_token_id)}

    # -- processor side -------------------------------------------------------------

    def render_prompt(
        self, messages: Sequence[ChatMessageDict], tools: list[dict] | None = None
    ) -> str:
        return self._processor.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=True, tokenize=False
        )

    def render_prompt_ids(
        self, messages: Sequence[ChatMessageDict], num_rows: Sequence[int]
    ) -> list[int]:
        raise NotImplementedError(f"{self.name} renders text; call render_prompt")

    def media_marker(self, modality: Modality) -> str:
        return self._processor.image_token

    def placeholder_text(self, modality: Modality, num_rows: int) -> str:
        return self._processor.image_token * num_rows

    def tokenize(self, text: str) -> list[int]:
        # The template writes every special token itself (as vLLM's chat path assumes).
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def processing_options(self, requested: Mapping[str, int], num_items: int) -> ProcessingOptions:
        options = ProcessingOptions.of(requested)
        self.check_options(options)
        return options

    def check_options(self, options: ProcessingOptions) -> None:
        for name, value in options.values:
            if name not in self.option_limits:
                takes = ", ".join(sorted(self.option_limits)) or "none"
                raise ValueError(
                    f"processing option {name!r} is not supported by {self.name} "
                    f"(it takes: {takes})"
                )
            low, high = self.option_limits[name]
            if not low <= value <= high:
                raise ValueError(f"processing option {name} = {value} is outside [{low}, {high}]")

    def item_options(self, options: ProcessingOptions, modality: Modality) -> ProcessingOptions:
        return options

    def video_sampler(self, options: ProcessingOptions, max_frames: int) -> FrameSampler:
        raise ValueError(f"{self.name} takes no video input")

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        raise NotImplementedError

    def decode_tokens(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # -- media encoder side --------------------------------------------------------------

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        raise NotImplementedError

    def process_image(self, image: DecodedImage) -> torch.Tensor:
        return self._process_images([image.image])[0]

    def _process_images(self, images: list[Image.Image]) -> torch.Tensor:
        return self._processor.image_processor(images, return_tensors="pt")["pixel_values"]

    def _fixed_pixels_shape(self) -> tuple[int, ...] | None:
        """`processed_pixels_shape`, found by processing two small blank images of opposite
        aspect ratios: one shape for both means the processor resizes or crops every
        image to it."""
        if not self.takes_processed_pixels:
            return None
        blanks = [Image.new("RGB", size) for size in ((64, 32), (32, 64))]
        shapes = {tuple(pixels.shape) for pixels in self._process_images(blanks)}
        return shapes.pop() if len(shapes) == 1 else None

    def _pixel_values(self, items: Sequence[MediaInput]) -> torch.Tensor:
        """The pixel values of fixed-size images, on this device: an item a gateway
        processed as it is, the others through the image processor in one call."""
        values: list[torch.Tensor | None] = [
            item.media.pixel_values if isinstance(item.media, ProcessedImage) else None
            for item in items
        ]
        to_process = [index for index, pixels in enumerate(values) if pixels is None]
        if to_process:
            processed = self._process_images([items[i].image.image for i in to_process])
            for index, pixels in zip(to_process, processed, strict=True):
                values[index] = pixels
        return torch.stack(values).to(self.device, self.dtype)

    def _media_model(self) -> Any:
        """`model.model`, when this process loaded the media encoder."""
        loaded = self._model and getattr(self._model.model, self.media_modules[0])
        self._require(loaded, "media encoder")
        return self._model.model

    def media_encoder_modules(self) -> list[torch.nn.Module]:
        model = self._media_model()
        return [getattr(model, name) for name in self.media_modules]

    # -- language model side ----------------------------------------------------------

    def check_layout(self, item: PlaceholderRange) -> None:
        layout = item.layout
        if (
            layout.grid_thw
            or layout.spatial_merge_size != 1
            or layout.num_planes != self.num_planes
        ):
            raise ValueError(
                f"item at offset {item.offset}: {self.name} items have no grid and "
                f"{self.num_planes} plane(s), got grid {list(layout.grid_thw)} (merge "
                f"{layout.spatial_merge_size}) and {layout.num_planes} plane(s)"
            )
        if self.fixed_item_rows is not None and item.length != self.fixed_item_rows:
            raise ValueError(
                f"item at offset {item.offset}: {self.name} images take "
                f"{self.fixed_item_rows} rows, not {item.length}"
            )

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        self._language_model()
        return self._model.get_input_embeddings()(token_ids.to(self.device))

    def positions(
        self, num_prompt_tokens: int, ranges: Sequence[PlaceholderRange], start: int, end: int
    ) -> torch.Tensor:
        # 1-D positions: an image row is one ordinary position.
        return torch.arange(start, end, device=self.device).unsqueeze(0)

    def kv_shape(self) -> KVShape:
        text = self._config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return KVShape(text.num_hidden_layers, text.num_key_value_heads, head_dim)

    @torch.inference_mode()
    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        media: PackedMedia | None = None,
        **attention_kwargs: Any,
    ) -> torch.Tensor:
        output = self._language_model()(
            inputs_embeds=inputs_embeds.unsqueeze(0),
            position_ids=position_ids,
            use_cache=False,
            **self._media_kwargs(media),
            **attention_kwargs,
        )
        return output.last_hidden_state[0]

    def _media_kwargs(self, media: PackedMedia | None) -> dict[str, Any]:
        """Extra language-model arguments for the rows' planes beyond the first."""
        return {}

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._language_model()
        logits = self._model.lm_head(hidden).float()
        cap = getattr(self._config.get_text_config(), "final_logit_softcapping", None)
        if cap is not None:  # Gemma: the model's own forward squashes logits so
            logits = torch.tanh(logits / cap) * cap
        return logits

    # -- helpers -------------------------------------------------------------------------

    def _language_model(self) -> torch.nn.Module:
        return self._require(self._model and self._model.model.language_model, "language model")

    def _require(self, module: Any, what: str) -> Any:
        if module is None:
            raise PartNotLoadedError(f"the {what} of {self.model_dir} was not loaded here")
        return module


# For a tokenizer that does not list its vocabulary: generous, so no prompt that fits is
# refused, and still a bound on what the front door tokenizes.
_UNLISTED_MAX_TOKEN_CHARS = 1024


def _max_token_chars(tokenizer: Any) -> int:
    """The longest vocabulary entry, in characters: byte-level BPE entries spell one
    character per byte, so an entry is never shorter than the text its token covers."""
    try:
        return max(1, max(len(entry) for entry in tokenizer.get_vocab()))
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        return _UNLISTED_MAX_TOKEN_CHARS


def _load_config(model_dir: Path) -> Any:
    return AutoConfig.from_pretrained(model_dir)


def _eos_token_ids(model_dir: Path, tokenizer: Any) -> tuple[int, ...]:
    """EOS ids from generation_config.json (may be a list), else the tokenizer's."""
    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)
