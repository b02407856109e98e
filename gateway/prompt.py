"""From chat messages to a prompt the decoder can run: template, hash, expand, place.

Each media item's single placeholder token from the chat template is expanded to as
many tokens as the item has embedding rows, and its range recorded:

    template ids:  [bos, user, <image>, t1, t2, end]          (item A: 3 rows)
    expanded ids:  [bos, user, <image>, <image>, <image>, t1, t2, end]
    ranges:        A at offset 2, length 3  ->  positions [2, 5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tessera.adapters import ModelFamily
from tessera.media import decode_image
from tessera.placeholders import Modality, PlaceholderRange

ROLES = ("system", "user", "assistant")


class PromptError(ValueError):
    """A request the gateway cannot turn into a prompt; the message says what to fix."""


@dataclass(frozen=True)
class TextPart:
    text: str


@dataclass(frozen=True)
class MediaPart:
    modality: Modality
    data: bytes


@dataclass(frozen=True)
class ChatInput:
    role: str
    parts: Sequence[TextPart | MediaPart]


@dataclass(frozen=True)
class PromptItem:
    range: PlaceholderRange
    data: bytes


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    items: list[PromptItem] = field(default_factory=list)


class PromptBuilder:
    def __init__(self, family: ModelFamily, max_image_pixels: int, limit_mm_per_prompt: int):
        self.family = family
        self.max_image_pixels = max_image_pixels
        self.limit_mm_per_prompt = limit_mm_per_prompt

    def build(self, messages: Sequence[ChatInput]) -> Prompt:
        """CPU-heavy (decoding and hashing images): call it off the event loop."""
        media = self._check_messages(messages)
        hashes_and_rows = [self._hash_and_count(index, part) for index, part in enumerate(media)]
        token_ids = self.family.render_prompt([_template_message(m) for m in messages])
        return self._expand(token_ids, media, hashes_and_rows)

    def _check_messages(self, messages: Sequence[ChatInput]) -> list[MediaPart]:
        if not messages:
            raise PromptError("messages is empty; send at least one message")
        media: list[MediaPart] = []
        for index, message in enumerate(messages):
            if message.role not in ROLES:
                raise PromptError(
                    f"message {index}: role {message.role!r} is not one of {', '.join(ROLES)}"
                )
            if not message.parts:
                raise PromptError(f"message {index} has no content parts")
            for part in message.parts:
                if isinstance(part, MediaPart):
                    if part.modality not in self.family.modalities:
                        takes = ", ".join(sorted(m.value for m in self.family.modalities))
                        raise PromptError(
                            f"message {index}: this model takes {takes} input, not "
                            f"{part.modality.value}"
                        )
                    media.append(part)
        if len(media) > self.limit_mm_per_prompt:
            raise PromptError(
                f"{len(media)} media items; at most {self.limit_mm_per_prompt} per request "
                "(--limit-mm-per-prompt)"
            )
        return media

    def _hash_and_count(self, index: int, part: MediaPart) -> tuple[str, int]:
        try:
            image = decode_image(part.data, self.max_image_pixels)
        except ValueError as error:
            raise PromptError(f"image {index}: {error}") from None
        return image.content_hash(self.family.fingerprint), self.family.num_placeholder_rows(image)

    def _expand(
        self, token_ids: list[int], media: list[MediaPart], hashes_and_rows: list[tuple[str, int]]
    ) -> Prompt:
        placeholder_ids = {self.family.placeholder_token_ids[m]: m for m in self.family.modalities}
        positions = [p for p, token in enumerate(token_ids) if token in placeholder_ids]
        if len(positions) != len(media):
            raise PromptError(
                f"the prompt has {len(positions)} media placeholders but {len(media)} media "
                "items were sent; do not write placeholder tokens such as '<image>' in text"
            )
        expanded: list[int] = []
        items: list[PromptItem] = []
        previous = 0
        for position, part, (content_hash, num_rows) in zip(
            positions, media, hashes_and_rows, strict=True
        ):
            expanded += token_ids[previous:position]
            placeholder = PlaceholderRange(part.modality, content_hash, len(expanded), num_rows)
            expanded += [token_ids[position]] * num_rows
            items.append(PromptItem(placeholder, part.data))
            previous = position + 1
        expanded += token_ids[previous:]
        if len(expanded) >= self.family.max_model_len:
            raise PromptError(
                f"the prompt is {len(expanded)} tokens after expanding {len(media)} media "
                f"items; the model's context is {self.family.max_model_len}: shorten it or "
                "send fewer items"
            )
        return Prompt(expanded, items)


def _template_message(message: ChatInput) -> dict:
    content = [
        {"type": "text", "text": part.text}
        if isinstance(part, TextPart)
        else {"type": part.modality.value}
        for part in message.parts
    ]
    return {"role": message.role, "content": content}
