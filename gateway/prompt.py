"""From chat messages to a prompt the decoder can run: template, hash, expand, place.

The chat template writes one marker per media item; each marker is replaced by the text
the family's processor would put there (as many placeholder tokens as the item has
embedding rows, and around them whatever else the processor adds), the result is
tokenized once, and each item's run of placeholder tokens becomes its range:

    template text: "<s><|user|>\\n<image>Compare.</s>"        (item A: 3 rows)
    expanded text: "<s><|user|>\\n<image><image><image>Compare.</s>"
    token ids:     [bos, user, nl, <image>, <image>, <image>, ...]
    ranges:        A at offset 3, length 3  ->  positions [3, 6)

Expanding the text, not the token ids, gives exactly the processor's token ids even
where it adds text around the placeholders (Gemma 3's blank lines).
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from jinja2 import TemplateError

from gateway.processed_pixels import PixelValues
from tessera.adapters import ItemPlacement, MediaInput, ModelFamily
from tessera.hashing import salted_hash
from tessera.media import ProcessingOptions
from tessera.media_decoder import MediaDecoder, MediaLimits
from tessera.placeholders import Modality, PlaceholderRange
from tessera.startup_flags import MediaCountLimits
from tessera.video import DecodedVideo

ROLES = ("system", "user", "assistant", "tool")
# A request's decoded videos, by their bytes.
DecodedVideos = dict[bytes, DecodedVideo]
T = TypeVar("T")


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
    # An assistant turn's calls, in the chat-template shape (arguments as a dict).
    tool_calls: Sequence[dict] = ()
    # A tool turn's answer to the call of this id.
    tool_call_id: str = ""

    @property
    def has_video(self) -> bool:
        return any(isinstance(p, MediaPart) and p.modality == Modality.VIDEO for p in self.parts)


@dataclass(frozen=True)
class PromptItem:
    range: PlaceholderRange
    data: bytes
    options: ProcessingOptions = field(default_factory=ProcessingOptions)
    # The image processor's output, for an encoder that trusts this gateway
    # (gateway/processed_pixels.py); None: the encoder decodes `data`.
    pixel_values: torch.Tensor | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    items: list[PromptItem] = field(default_factory=list)


@dataclass(frozen=True)
class _PreparedItem:
    modality: Modality
    data: bytes
    content_hash: str
    placement: ItemPlacement
    options: ProcessingOptions
    pixel_values: torch.Tensor | None


class PromptBuilder:
    def __init__(
        self,
        family: ModelFamily,
        limits: MediaLimits,
        limit_mm_per_prompt: MediaCountLimits | int,
        default_processing_options: Mapping[str, int] | None = None,
        send_processed_pixels: bool = False,
    ):
        """`send_processed_pixels`: attach large images' pixel values for the encoders
        (gateway/processed_pixels.py); only an encoder that trusts this gateway uses them."""
        self.family = family
        self.pixel_values = PixelValues(family, send_processed_pixels)
        self.decoder = MediaDecoder.for_family(family, limits)
        # A plain number: that many items of every modality.
        self.limit_mm_per_prompt = MediaCountLimits.of(limit_mm_per_prompt)
        self.default_processing_options = dict(default_processing_options or {})

    def build(
        self,
        messages: Sequence[ChatInput],
        processing_options: Mapping[str, int] | None = None,
        cache_salt: str = "",
        tools: Sequence[dict] = (),
        videos: DecodedVideos | None = None,
    ) -> Prompt:
        """CPU-heavy (decoding and hashing images): call it off the event loop.
        `processing_options` overlay the server's defaults for this request's items;
        `cache_salt` salts their content hashes (tessera.hashing.salted_hash); `tools`
        (OpenAI's shape) go to the chat template; `videos`: what `decode_videos`
        returned for these messages (else videos are decoded here)."""
        media = self._check_messages(messages)
        options = self._request_options(processing_options, len(media))
        prepared = self._prepare_all(media, options, cache_salt, videos or {})
        template_messages = [_template_message(m) for m in messages]
        if self.family.renders_token_ids:
            if tools:
                raise PromptError(f"tools are not supported by {self.family.name}")
            num_rows = [item.placement.num_rows for item in prepared]
            token_ids = _rendered(self.family.render_prompt_ids, template_messages, num_rows)
            return self._placed(token_ids, prepared)
        rendered = _rendered(self.family.render_prompt, template_messages, list(tools) or None)
        return self._expand(rendered, prepared)

    def decode_videos(
        self, messages: Sequence[ChatInput], processing_options: Mapping[str, int] | None = None
    ) -> DecodedVideos:
        """The messages' videos decoded and sampled, for `build`: videos take long to
        decode, so the gateway decodes them on threads of their own, where they hold up
        no other request's prompt. Raises PromptError naming the video and what to fix."""
        media = self._check_messages(messages)
        options = self._request_options(processing_options, len(media))
        videos: DecodedVideos = {}
        for index, part in enumerate(media):
            if part.modality == Modality.VIDEO and part.data not in videos:
                try:
                    item_options = self._item_options(options, part.modality)
                    videos[part.data] = self.decoder.decode(part.modality, part.data, item_options)
                except ValueError as error:
                    raise PromptError(f"video {index}: {error}") from None
        return videos

    def _request_options(
        self, processing_options: Mapping[str, int] | None, num_items: int
    ) -> ProcessingOptions:
        requested = {**self.default_processing_options, **(processing_options or {})}
        try:
            return self.family.processing_options(requested, num_items)
        except ValueError as error:
            raise PromptError(f"mm_processor_kwargs: {error}") from None

    def from_token_ids(self, token_ids: Sequence[int]) -> Prompt:
        """A prompt given as token ids (/v1/completions): no template and no media, so a
        placeholder token (with no item behind it) or one outside the vocabulary is refused."""
        outside = [t for t in token_ids if not 0 <= t < self.family.vocab_size]
        if outside:
            raise PromptError(
                f"token id {outside[0]} is outside the vocabulary (size {self.family.vocab_size})"
            )
        return self._placed(list(token_ids), [])

    def _check_messages(self, messages: Sequence[ChatInput]) -> list[MediaPart]:
        if not messages:
            raise PromptError("messages is empty; send at least one message")
        media: list[MediaPart] = []
        for index, message in enumerate(messages):
            if message.role not in ROLES:
                raise PromptError(
                    f"message {index}: role {message.role!r} is not one of {', '.join(ROLES)}"
                )
            if not message.parts and not message.tool_calls:
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
        self._check_text_length(messages)
        self._check_media_counts(media)
        try:
            self.decoder.check_request_pixels((part.modality, part.data) for part in media)
        except ValueError as error:
            raise PromptError(str(error)) from None
        return media

    def _check_media_counts(self, media: Sequence[MediaPart]) -> None:
        """Refuses more items of a modality than --limit-mm-per-prompt allows, naming it."""
        counts = Counter(part.modality.value for part in media)
        for modality, count in sorted(counts.items()):
            limit = self.limit_mm_per_prompt.limit(modality)
            if count > limit:
                raise PromptError(
                    f"{count} {modality} items; at most {limit} {modality} items per request "
                    "(--limit-mm-per-prompt)"
                )

    def _check_text_length(self, messages: Sequence[ChatInput]) -> None:
        """Refuses text that cannot fit the context before it is tokenized: tokenizing
        costs memory and time in proportion to the text, whatever the context."""
        num_chars = sum(
            len(part.text)
            for message in messages
            for part in message.parts
            if isinstance(part, TextPart)
        )
        max_chars = self.family.max_model_len * self.family.max_token_chars
        if num_chars > max_chars:
            raise PromptError(
                f"the messages hold {num_chars} characters of text; this model's context of "
                f"{self.family.max_model_len} tokens holds at most {max_chars}: shorten them"
            )

    def _prepare_all(
        self,
        media: Sequence[MediaPart],
        options: ProcessingOptions,
        cache_salt: str,
        videos: DecodedVideos,
    ) -> list[_PreparedItem]:
        """Each part decoded and hashed once per request: an item sent again in the same
        request (the same picture twice, in one message or in two turns) reuses the
        first one's work. Parts are told apart by length before their bytes are compared,
        so distinct items cost no extra pass over their bytes."""
        seen: dict[tuple[Modality, int], list[_PreparedItem]] = {}
        prepared = []
        for index, part in enumerate(media):
            same_size = seen.setdefault((part.modality, len(part.data)), [])
            item = next((i for i in same_size if i.data == part.data), None)
            if item is None:
                item = self._prepare(index, part, options, cache_salt, videos.get(part.data))
                same_size.append(item)
            prepared.append(item)
        return prepared

    def _prepare(
        self,
        index: int,
        part: MediaPart,
        options: ProcessingOptions,
        cache_salt: str,
        decoded: DecodedVideo | None,
    ) -> _PreparedItem:
        try:
            options = self._item_options(options, part.modality)
            media = decoded or self.decoder.decode(part.modality, part.data, options)
            placement = self.family.item_placement(MediaInput(media, options))
        except ValueError as error:
            raise PromptError(f"{part.modality.value} {index}: {error}") from None
        content_hash, pixels = self.pixel_values.hash_and_pixels(
            media,
            lambda: salted_hash(media.content_hash(self.family.fingerprint, options), cache_salt),
        )
        return _PreparedItem(part.modality, part.data, content_hash, placement, options, pixels)

    def _item_options(self, options: ProcessingOptions, modality: Modality) -> ProcessingOptions:
        """The request's options an item of `modality` is processed and hashed with. A
        video's carry the frame limit it was sampled under, so every encoder samples the
        same frames whatever its own --max-video-frames."""
        item_options = self.family.item_options(options, modality)
        if modality == Modality.VIDEO and item_options.get("max_frames") is None:
            max_frames = self.decoder.limits.video.max_frames
            item_options = ProcessingOptions.of(
                {**item_options.as_dict(), "max_frames": max_frames}
            )
        return item_options

    def _expand(self, text: str, prepared: list[_PreparedItem]) -> Prompt:
        expanded, in_prompt_order = self._replace_markers(text, prepared)
        return self._placed(self.family.tokenize(expanded), in_prompt_order)

    def _placed(self, token_ids: list[int], in_prompt_order: list[_PreparedItem]) -> Prompt:
        """The prompt with each item's range located, if it fits the model's context."""
        items = self._locate(token_ids, in_prompt_order)
        if len(token_ids) >= self.family.max_model_len:
            raise PromptError(
                f"the prompt is {len(token_ids)} tokens after expanding {len(items)} media "
                f"items; the model's context is {self.family.max_model_len}: shorten it or "
                "send fewer items"
            )
        return Prompt(token_ids, items)

    def _replace_markers(
        self, text: str, prepared: list[_PreparedItem]
    ) -> tuple[str, list[_PreparedItem]]:
        """Each marker the template wrote, replaced by its item's placeholder text; the
        k-th marker of a modality is that modality's k-th item."""
        markers = {self.family.media_marker(m): m for m in self.family.modalities}
        queues = {m: deque(p for p in prepared if p.modality == m) for m in markers.values()}
        pattern = re.compile("|".join(re.escape(marker) for marker in markers))
        pieces: list[str] = []
        in_prompt_order: list[_PreparedItem] = []
        previous = 0
        for match in pattern.finditer(text):
            queue = queues[markers[match.group()]]
            if not queue:
                raise self._count_error(text, pattern, prepared)
            item = queue.popleft()
            placeholder = item.placement.placeholder_text or self.family.placeholder_text(
                item.modality, item.placement.num_rows
            )
            pieces += [text[previous : match.start()], placeholder]
            in_prompt_order.append(item)
            previous = match.end()
        if any(queues.values()):
            raise self._count_error(text, pattern, prepared)
        pieces.append(text[previous:])
        return "".join(pieces), in_prompt_order

    @staticmethod
    def _count_error(text: str, pattern: re.Pattern, prepared: list[_PreparedItem]) -> PromptError:
        return PromptError(
            f"the prompt has {len(pattern.findall(text))} media placeholders but "
            f"{len(prepared)} media items were sent; do not write placeholder tokens such "
            "as '<image>' in text"
        )

    def _locate(
        self, token_ids: list[int], in_prompt_order: list[_PreparedItem]
    ) -> list[PromptItem]:
        """Each item's ranges: its runs of placeholder tokens, in prompt order (one run,
        or one per frame where the processor writes text between them)."""
        placeholder_ids = self.family.placeholder_token_ids
        items: list[PromptItem] = []
        cursor = 0
        for item in in_prompt_order:
            token, num_rows = placeholder_ids[item.modality], item.placement.rows_per_range
            for index in range(item.placement.num_ranges):
                try:
                    offset = token_ids.index(token, cursor)
                except ValueError:
                    offset = -1
                if offset < 0 or token_ids[offset : offset + num_rows] != [token] * num_rows:
                    raise PromptError(
                        "the prompt's placeholder tokens do not match its media items; do "
                        "not write placeholder tokens in text"
                    )
                placeholder = PlaceholderRange(
                    item.modality,
                    item.content_hash,
                    offset,
                    num_rows,
                    item.placement.layout,
                    row_start=index * num_rows,
                )
                items.append(PromptItem(placeholder, item.data, item.options, item.pixel_values))
                cursor = offset + num_rows
        num_placeholders = sum(token_ids.count(t) for t in set(placeholder_ids.values()))
        if num_placeholders != sum(item.range.length for item in items):
            raise PromptError(
                "the prompt holds placeholder tokens of no media item; do not write "
                "placeholder tokens in text"
            )
        return items


def _rendered(render: Callable[..., T], *args: object) -> T:
    """`render(*args)`; a conversation the chat template or tokenizer refuses (a role
    order or a mix of parts the model does not take) is the caller's to fix."""
    try:
        return render(*args)
    except (ValueError, TemplateError) as error:
        raise PromptError(f"the model's chat template refused the messages: {error}") from None


def _template_message(message: ChatInput) -> dict:
    if message.tool_calls or message.role == "tool":
        # Templates write these turns' content as a string (Qwen2.5's `'\n' + content`).
        text = "".join(part.text for part in message.parts if isinstance(part, TextPart))
        rendered: dict = {"role": message.role, "content": text}
        if message.tool_calls:
            rendered["tool_calls"] = list(message.tool_calls)
        if message.tool_call_id:
            rendered["tool_call_id"] = message.tool_call_id
        return rendered
    content = [
        {"type": "text", "text": part.text}
        if isinstance(part, TextPart)
        else {"type": part.modality.value}
        for part in message.parts
    ]
    return {"role": message.role, "content": content}
