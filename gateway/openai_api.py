"""The OpenAI chat-completions wire format: request bodies in, responses and stream chunks
out. Every problem with a body is a `Rejected` naming the field (`param`) to fix."""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from typing import Any

from gateway import fields, sampling_body
from gateway.choices import check_n
from gateway.fields import check_fields
from gateway.front import ChatRequest, Rejected
from gateway.generation_defaults import NEUTRAL, SamplingDefaults
from gateway.logprobs import LogprobsRequest, logprobs_request, num_top_logprobs
from gateway.media_fetch import MediaFetchPolicy, MediaURLError, load_media_url
from gateway.prompt import ChatInput, MediaPart, TextPart
from gateway.sampling_body import MAX_TOKENS_LIMIT
from gateway.sampling_body import boolean as _boolean
from gateway.sampling_body import integer as _integer
from gateway.sampling_body import require as _require
from gateway.tools import (
    DEFAULT_TOOL_SETTINGS,
    ToolSettings,
    forced_call_grammar,
    history_fields,
    tools_from_body,
)
from tessera.media import options_from_json
from tessera.placeholders import Modality
from tessera.v1 import common_pb2

MAX_STOP_STRINGS = 4


def sampling_from_body(
    body: dict, logprobs: LogprobsRequest, defaults: SamplingDefaults = NEUTRAL
) -> common_pb2.SamplingParams:
    """Every sampling field (gateway/sampling_body.py), with the logprobs the endpoint's
    own shape asked for (chat: a bool and top_logprobs; completions: an int)."""
    sampling = sampling_body.sampling_from_body(body, defaults)
    sampling.num_top_logprobs = num_top_logprobs(logprobs)
    return sampling


def stops_from_body(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    _require(
        isinstance(stops, list)
        and len(stops) <= MAX_STOP_STRINGS
        and all(isinstance(s, str) for s in stops),
        f"stop must be a string or a list of at most {MAX_STOP_STRINGS} strings",
        "stop",
    )
    return stops


def stream_settings(body: dict) -> tuple[bool, bool]:
    """`stream` and `stream_options.include_usage`. stream_options is checked, then
    refused without `stream: true`, as vLLM does (else it would be silently ignored)."""
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    _require(
        options is None or isinstance(options, dict),
        "stream_options must be an object",
        "stream_options",
    )
    options = options or {}
    unknown = sorted(set(options) - {"include_usage"})
    _require(not unknown, f"stream_options takes include_usage, not {unknown}", "stream_options")
    include_usage = _boolean(options, "include_usage", "stream_options.include_usage")
    _require(
        body.get("stream_options") is None or stream,
        "stream_options is only allowed with stream: true",
        "stream_options",
    )
    return stream, include_usage


async def messages_from_body(body: dict, policy: MediaFetchPolicy) -> list[ChatInput]:
    messages = body.get("messages")
    _require(
        isinstance(messages, list) and messages, "messages must be a non-empty list", "messages"
    )
    parsed = [_message(index, message) for index, message in enumerate(messages)]
    # Media URLs are fetched concurrently.
    jobs = [part for message in parsed for part in message[1] if isinstance(part, _PendingMedia)]
    loaded = await asyncio.gather(*(job.load(policy) for job in jobs))
    resolved = dict(zip(map(id, jobs), loaded, strict=True))
    return [
        ChatInput(role, [resolved.get(id(part), part) for part in parts], **extras)
        for role, parts, extras in parsed
    ]


class _PendingMedia:
    def __init__(self, modality: Modality, url: str | None, data: bytes | None, param: str):
        self.modality, self.url, self.data, self.param = modality, url, data, param

    async def load(self, policy: MediaFetchPolicy) -> MediaPart:
        if self.data is not None:
            return MediaPart(self.modality, self.data)
        try:
            return MediaPart(self.modality, await load_media_url(self.url, policy))
        except MediaURLError as error:
            raise Rejected(str(error), param=self.param) from None


def _message(index: int, message: Any) -> tuple[str, list, dict]:
    param = f"messages[{index}]"
    _require(isinstance(message, dict), f"{param} must be an object", param)
    role = message.get("role")
    _require(isinstance(role, str), f"{param}.role must be a string", f"{param}.role")
    extras = history_fields(param, message)
    content = message.get("content")
    if isinstance(content, str):
        return role, [TextPart(_unicode(content, f"{param}.content"))], extras
    if content is None and extras.get("tool_calls"):
        return role, [], extras  # an assistant turn of calls only
    _require(
        isinstance(content, list) and content,
        f"{param}.content must be a string or a non-empty list of parts",
        f"{param}.content",
    )
    return role, [_part(f"{param}.content[{i}]", p) for i, p in enumerate(content)], extras


def _unicode(text: str, param: str) -> str:
    """JSON may carry lone surrogates ("\\ud800"), which no tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Rejected(f"{param} is not valid Unicode (a lone surrogate)", param=param) from None
    return text


def _part(param: str, part: Any) -> TextPart | _PendingMedia:
    _require(isinstance(part, dict), f"{param} must be an object", param)
    kind = part.get("type")
    # Checked first: an unhashable type ({} or []) would raise from the lookups below.
    _require(isinstance(kind, str), f"{param}.type must be a string", param)
    if kind == "text":
        _require(isinstance(part.get("text"), str), f"{param}.text must be a string", param)
        return TextPart(_unicode(part["text"], f"{param}.text"))
    if kind in _URL_PARTS:
        holder = part.get(kind)
        url = holder.get("url") if isinstance(holder, dict) else holder
        _require(isinstance(url, str) and url, f"{param}.{kind}.url must be a URL", param)
        return _PendingMedia(_URL_PARTS[kind], url, None, param)
    if kind == "input_audio":
        return _PendingMedia(Modality.AUDIO, None, _input_audio(param, part), param)
    raise Rejected(
        f"{param}.type {kind!r} is not supported; use text, image_url, video_url, "
        "input_audio or audio_url",
        param=param,
    )


# OpenAI's `image_url` and vLLM's `audio_url` and `video_url`: a data URL or an http(s) URL.
_URL_PARTS = {
    "image_url": Modality.IMAGE,
    "audio_url": Modality.AUDIO,
    "video_url": Modality.VIDEO,
}
# What OpenAI's `input_audio.format` may say; the bytes are probed, so it only must be one
# of the containers FFmpeg reads.
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus", "m4a", "aac", "webm")
# Padded base64, as the OpenAPI document states it for input_audio.data; decode_base64
# accepts exactly the strings it matches (tests/unit/test_openapi.py checks that).
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def _input_audio(param: str, part: dict) -> bytes:
    """OpenAI's `{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav"}}`."""
    audio = part.get("input_audio")
    _require(isinstance(audio, dict), f"{param}.input_audio must be an object", param)
    unknown = sorted(set(audio) - {"data", "format"})
    _require(not unknown, f"{param}.input_audio takes data and format, not {unknown}", param)
    audio_format = audio.get("format", "wav")
    _require(
        audio_format in AUDIO_FORMATS,
        f"{param}.input_audio.format {audio_format!r} is not one of {', '.join(AUDIO_FORMATS)}",
        param,
    )
    data = audio.get("data")
    # A string before decoding: b64decode raises TypeError (a 500) on a number or a list.
    _require(isinstance(data, str), f"{param}.input_audio.data must be a base64 string", param)
    clip = decode_base64(data)
    _require(clip is not None, f"{param}.input_audio.data must be base64", param)
    return clip


def decode_base64(data: str) -> bytes | None:
    """The bytes of `data` if it matches BASE64_PATTERN, else None. b64decode alone also
    takes padding after a whole group ("ABCD="), which the length check refuses."""
    if len(data) % 4:
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True)
class ChatBody:
    """A parsed chat-completions body: the request of choice 0, and how to answer."""

    chat: ChatRequest
    n: int
    logprobs: LogprobsRequest
    stream: bool
    include_usage: bool


def request_basics(body: dict) -> tuple[str, str]:
    """(model, cache_salt), the fields every generating endpoint reads alike."""
    model = body.get("model", "")
    _require(isinstance(model, str), "model must be a string", "model")
    salt = body.get("cache_salt", "")
    _require(isinstance(salt, str), "cache_salt must be a string", "cache_salt")
    return model, salt


def max_tokens_from_body(body: dict) -> int:
    """max_completion_tokens (OpenAI's newer name) wins over max_tokens unless it is null;
    0: until the context is full."""
    max_tokens = _integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)
    max_completion_tokens = _integer(body, "max_completion_tokens", 1, MAX_TOKENS_LIMIT)
    return max_completion_tokens or max_tokens or 0


@dataclass(frozen=True)
class ChatSettings:
    """The gateway's settings a chat body is read with."""

    policy: MediaFetchPolicy
    timeout_seconds: float
    max_logprobs: int
    defaults: SamplingDefaults = NEUTRAL  # from the checkpoint's generation_config
    tool_settings: ToolSettings = DEFAULT_TOOL_SETTINGS


async def chat_body(body: Any, request_id: str, settings: ChatSettings) -> ChatBody:
    check_fields(body, fields.CHAT)
    logprobs = logprobs_request(
        body.get("logprobs"), body.get("top_logprobs"), settings.max_logprobs
    )
    chat = await chat_request_from_body(body, request_id, settings, logprobs)
    stream, include_usage = stream_settings(body)
    n = check_n(body.get("n"), chat.sampling.max_tokens)
    return ChatBody(chat, n, logprobs, stream, include_usage)


async def chat_request_from_body(
    body: dict, request_id: str, settings: ChatSettings, logprobs: LogprobsRequest
) -> ChatRequest:
    model, salt = request_basics(body)
    kwargs = body.get("mm_processor_kwargs")
    try:
        # Only null is "none": false, 0 or "" are not an object of settings.
        processing_options = options_from_json({} if kwargs is None else kwargs)
    except ValueError as error:
        raise Rejected(f"mm_processor_kwargs {error}", param="mm_processor_kwargs") from None
    sampling = sampling_from_body(body, logprobs, settings.defaults)
    tools = tools_from_body(body, settings.tool_settings)
    forced = forced_call_grammar(tools) if tools else None
    if forced is not None:
        _require(
            not sampling.HasField("structured_output"),
            'a forced tool_choice ("required" or a function) cannot take response_format too',
            "tool_choice",
        )
        sampling.structured_output.CopyFrom(forced)
    return ChatRequest(
        request_id=request_id,
        model=model,
        messages=await messages_from_body(body, settings.policy),
        sampling=sampling,
        tools=tools,
        stop=stops_from_body(body),
        max_chunk_tokens=_integer(body, "max_chunk_tokens", 0, MAX_TOKENS_LIMIT) or 0,
        cache_salt=salt,
        timeout_seconds=settings.timeout_seconds,
        processing_options=processing_options,
    )
