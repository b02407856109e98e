"""The one interface every model family implements.

A family is loaded in parts: the gateway needs only the processor (tokenizer, chat
template, how many rows an item takes and how they are laid out), an encoder the
processor and the media tower, a decoder the processor and the language model. Asking a
family for a part it did not load raises, so a service cannot silently hold weights it
should not.

What differs between families, and how the interface absorbs it:
- rows per item: fixed (LLaVA, Gemma 3) or from the item's size (Qwen-VL, OneVision):
  `item_placement` at the front door gives the count and the layout that travels with it;
- positions: 1-D, or multimodal RoPE computed from each item's layout (`positions`);
- planes: Qwen3-VL's deepstack rows ride beside the main rows and reach the language
  model through `forward(..., media=PackedMedia)`;
- attention: `AttentionRules` says whether a chunk may cut an item and whether tokens of
  an item see each other both ways.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Flag, auto
from typing import Any, Protocol

import torch

from tessera.audio import DecodedAudio
from tessera.media import DecodedImage, ProcessingOptions
from tessera.placeholders import ItemLayout, Modality, PlaceholderRange
from tessera.video import DecodedVideo, FrameSampler


class ModelPart(Flag):
    PROCESSOR = auto()
    MEDIA_ENCODER = auto()
    LANGUAGE_MODEL = auto()


class PartNotLoadedError(RuntimeError):
    """A service asked a family for a part it was not loaded with."""


@dataclass(frozen=True)
class LoadOptions:
    """Where and how to load weights."""

    parts: ModelPart
    device: str = "cpu"
    # A torch dtype, or a --dtype name ("auto": the checkpoint's), which load_family
    # resolves before the family sees it.
    dtype: torch.dtype | str = torch.float32
    # A name registered with transformers' AttentionInterface for the language model
    # (the decoder's paged attention); None keeps the model's default.
    text_attention: str | None = None
    # The gateway's --chat-template: renders prompts instead of the checkpoint's template.
    chat_template: str | None = None
    # What runs the language model's linear layers on a CPU in float32: "torch",
    # "onednn" (weights packed once, tessera.onednn_linear) or "auto" (measured shape by
    # shape at load, tessera.linear_choice). The decoder's --linear-kernel.
    linear_kernel: str = "torch"


@dataclass(frozen=True)
class KVShape:
    """What one token's K/V take in each layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class AttentionRules:
    """How a family's language model attends around media items."""

    # False: a prefill chunk never cuts an item (the scheduler moves chunk ends to item
    # boundaries), because an item's rows must be computed together.
    split_items: bool = True
    # True: tokens inside one item attend to each other in both directions (Gemma 3);
    # everything else stays causal.
    bidirectional_items: bool = False


@dataclass(frozen=True)
class ProcessedImage:
    """An image as the model's image processor made it (a trusted gateway did, so the
    encoder need not decode its file): float32 pixel values of the family's
    `processed_pixels_shape`."""

    pixel_values: torch.Tensor


@dataclass(frozen=True)
class MediaInput:
    """A decoded item (an image, a clip of audio, a video's sampled frames), or an image
    already processed, and the processing options it is encoded with."""

    media: DecodedImage | ProcessedImage | DecodedAudio | DecodedVideo
    options: ProcessingOptions = field(default_factory=ProcessingOptions)

    @property
    def modality(self) -> Modality:
        if isinstance(self.media, DecodedAudio):
            return Modality.AUDIO
        return Modality.VIDEO if isinstance(self.media, DecodedVideo) else Modality.IMAGE

    @property
    def video(self) -> DecodedVideo:
        if not isinstance(self.media, DecodedVideo):
            raise TypeError(f"this item is {self.modality.value}, not a video")
        return self.media

    @property
    def image(self) -> DecodedImage:
        if not isinstance(self.media, DecodedImage):
            raise TypeError(f"this item is {self.modality.value}, not an image")
        return self.media

    @property
    def audio(self) -> DecodedAudio:
        if not isinstance(self.media, DecodedAudio):
            raise TypeError(f"this item is {self.modality.value}, not audio")
        return self.media


@dataclass(frozen=True)
class ItemPlacement:
    """How many placeholder rows an item takes in the prompt, and how they are laid out.

    `num_ranges` > 1: the processor writes text between the rows, which then sit in that
    many runs of `num_rows / num_ranges` (a Qwen3-VL video: one run per frame, after its
    timestamp); `placeholder_text` is then what replaces the item's marker (empty: the
    family's `placeholder_text`)."""

    num_rows: int
    layout: ItemLayout = field(default_factory=ItemLayout)
    num_ranges: int = 1
    placeholder_text: str = ""

    @property
    def rows_per_range(self) -> int:
        return self.num_rows // self.num_ranges


@dataclass(frozen=True)
class PackedMedia:
    """The media rows of one packed forward beyond their first plane (which the runner
    writes into the input embeddings): Qwen3-VL's deepstack levels."""

    # [num_packed_tokens] True where a packed token holds a media row.
    mask: torch.Tensor
    # [mask.sum(), (num_planes - 1) * hidden_size] the other planes, in packed order.
    extra_planes: torch.Tensor


# A chat message in the transformers chat-template shape:
# {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}
ChatMessageDict = dict[str, Any]


class ModelFamily(Protocol):
    """What Tessera needs of a model family."""

    name: str
    fingerprint: str
    modalities: frozenset[Modality]
    placeholder_token_ids: dict[Modality, int]
    hidden_size: int
    # Planes per embedding row; an encoded row is `num_planes * hidden_size` wide.
    num_planes: int
    attention: AttentionRules
    # Rows every item of the family takes when that is fixed (None: it depends on the item).
    fixed_item_rows: int | None
    # Audio families: the rate their feature extractor takes (clips are resampled to it
    # at the front door) and the longest clip they take in one item (None: no cap).
    audio_sampling_rate: int | None
    max_audio_seconds: float | None
    vocab_size: int
    max_model_len: int
    # The most characters one token stands for (the longest vocabulary entry): text of
    # more than max_model_len * max_token_chars characters cannot fit the context, which
    # the front door tells without tokenizing it.
    max_token_chars: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype
    # What runs the language model's linear layers: "torch", "onednn" (packed at load),
    # or what --linear-kernel auto chose ("auto:torch", "auto:onednn", "auto:onednn+torch").
    linear_kernel: str

    # -- processor side (gateway, encoder) ----------------------------------------------

    # True: the family's tokenizer renders chat messages straight to token ids (Mistral's
    # tokenizers encode each text chunk on its own, so text cannot be expanded and then
    # tokenized): the front door calls `render_prompt_ids`, not `render_prompt`.
    renders_token_ids: bool

    def render_prompt(
        self, messages: Sequence[ChatMessageDict], tools: list[dict] | None = None
    ) -> str:
        """The chat template's text: one `media_marker` per item, in prompt order, and
        `tools` (OpenAI's function shape) wherever the template lists them."""
        ...

    def render_prompt_ids(
        self, messages: Sequence[ChatMessageDict], num_rows: Sequence[int]
    ) -> list[int]:
        """Token ids of the whole prompt, each item's run of placeholder tokens exactly
        `num_rows[k]` long for the k-th item in message order. Raises ValueError naming
        what to fix."""
        ...

    def media_marker(self, modality: Modality) -> str:
        """The text the chat template writes for one item of `modality`."""
        ...

    def placeholder_text(self, modality: Modality, num_rows: int) -> str:
        """What the processor replaces one marker with for an item of `num_rows` rows."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of rendered prompt text (the template wrote every special token)."""
        ...

    def processing_options(self, requested: Mapping[str, int], num_items: int) -> ProcessingOptions:
        """The options an item of a prompt with `num_items` items is processed with:
        `requested` (server defaults overlaid by the request's) checked, plus whatever the
        family derives itself. Raises ValueError naming what to fix."""
        ...

    def check_options(self, options: ProcessingOptions) -> None:
        """Raises ValueError unless `options` (as received on the wire) are valid."""
        ...

    def item_options(self, options: ProcessingOptions, modality: Modality) -> ProcessingOptions:
        """The part of a prompt's `options` that items of `modality` are processed with
        (and hashed with): image settings do not split a video's cache entries, nor
        video settings an image's; plus what the family derives for the modality."""
        ...

    def video_sampler(self, options: ProcessingOptions, max_frames: int) -> FrameSampler:
        """Which frames of a video the family keeps under `options`, its processor's
        way, never more than `max_frames`. Raises ValueError naming what to fix."""
        ...

    def item_placement(self, item: MediaInput) -> ItemPlacement:
        """Rows and layout of an item, computed from its size alone (no pixels)."""
        ...

    def decode_tokens(self, token_ids: Sequence[int]) -> str: ...

    # The shape of one image's pixel values where the family encodes images from the
    # image processor's output and the processor makes every image that shape (it resizes
    # or crops to a fixed size), e.g. (3, 336, 336); None otherwise. Then a gateway can
    # process an image once and hand its encoder the pixel values (`process_image`).
    processed_pixels_shape: tuple[int, ...] | None

    def process_image(self, image: DecodedImage) -> torch.Tensor:
        """One image's pixel values exactly as `encode` would make them from the decoded
        image (float32, on the CPU, of `processed_pixels_shape`)."""
        ...

    # -- media encoder side ---------------------------------------------------------------

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        """One `[rows, num_planes * hidden_size]` tensor per item, in as few forwards as
        the family allows."""
        ...

    def media_encoder_modules(self) -> list[torch.nn.Module]:
        """The modules `encode` runs (the tower and its projector)."""
        ...

    # -- language model side --------------------------------------------------------------

    def check_layout(self, item: PlaceholderRange) -> None:
        """Raises ValueError unless the item's layout fits its length and this model."""
        ...

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """`[n]` token ids -> `[n, hidden_size]` input embeddings."""
        ...

    def positions(
        self, num_prompt_tokens: int, ranges: Sequence[PlaceholderRange], start: int, end: int
    ) -> torch.Tensor:
        """Position ids for sequence positions `[start, end)` (prompt or generated), in the
        shape the language model takes for a batch of one, with the positions as the last
        dimension: exactly the slice of what the whole sequence would get."""
        ...

    def kv_shape(self) -> KVShape: ...

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        media: PackedMedia | None = None,
        **attention_kwargs: Any,
    ) -> torch.Tensor:
        """Runs `[n, hidden]` packed embeddings through the language model; the keyword
        arguments reach the attention function. Returns `[n, hidden]` final hidden states."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[k, hidden]` -> `[k, vocab]` float32 logits."""
        ...
