"""The one interface every model family implements.

A family is loaded in parts: the gateway needs only the processor (tokenizer, chat
template, how many rows an item takes), an encoder the processor and the media tower, a
decoder the processor and the language model. Asking a family for a part it did not load
raises, so a service cannot silently hold weights it should not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Flag, auto
from typing import Any, Protocol

import torch

from tessera.media import DecodedImage
from tessera.placeholders import Modality, PlaceholderRange


class ModelPart(Flag):
    PROCESSOR = auto()
    MEDIA_ENCODER = auto()
    LANGUAGE_MODEL = auto()


@dataclass(frozen=True)
class LoadOptions:
    """Where and how to load weights."""

    parts: ModelPart
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    # A name registered with transformers' AttentionInterface for the language model
    # (the decoder's paged attention); None keeps the model's default.
    text_attention: str | None = None


@dataclass(frozen=True)
class KVShape:
    """What one token's K/V take in each layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


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
    vocab_size: int
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype

    # Processor side (gateway, encoder).
    def render_prompt(self, messages: Sequence[ChatMessageDict]) -> list[int]:
        """Applies the chat template and tokenizes; one placeholder token per item."""
        ...

    def num_placeholder_rows(self, item: DecodedImage) -> int:
        """How many embedding rows (and so placeholder tokens) the item takes."""
        ...

    def decode_tokens(self, token_ids: Sequence[int]) -> str: ...

    # Media encoder side.
    def encode(self, items: Sequence[DecodedImage]) -> list[torch.Tensor]:
        """One `[num_placeholder_rows(item), hidden_size]` tensor per item, one forward."""
        ...

    # Language model side.
    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        """`[n]` token ids -> `[n, hidden_size]` input embeddings."""
        ...

    def positions(
        self, num_prompt_tokens: int, ranges: Sequence[PlaceholderRange], start: int, end: int
    ) -> torch.Tensor:
        """Position ids for sequence positions `[start, end)` (prompt or generated), in the
        shape the language model takes for a batch of one."""
        ...

    def kv_shape(self) -> KVShape: ...

    def forward(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **attention_kwargs: Any
    ) -> torch.Tensor:
        """Runs `[n, hidden]` packed embeddings through the language model; the keyword
        arguments reach the attention function. Returns `[n, hidden]` final hidden states."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[k, hidden]` -> `[k, vocab]` float32 logits."""
        ...
