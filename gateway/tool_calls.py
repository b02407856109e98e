"""Tool calls parsed out of generated text: the hermes format (vLLM's `hermes` parser,
what Qwen2.5/Qwen3 and the demo chat templates ask the model to write):

    Let me look.<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Text outside calls is content; each well-formed call becomes an OpenAI tool call with
its arguments as a JSON string; a call whose JSON does not parse stays content, raw.
Whitespace between or after calls is dropped.

One parser serves both shapes of response: `HermesStream` turns text deltas into OpenAI
stream deltas (content until a call opens, then the call's id, type and name, then its
arguments), and `parse_tool_calls` folds the deltas of the whole text into a message, so
a stream always reassembles to the non-streamed answer.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
PARSERS = ("hermes", "none")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedMessage:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class HermesStream:
    """Text in, OpenAI stream deltas out (`{"content": ...}` or `{"tool_calls": [...]}`).
    `max_calls` (1 without parallel_tool_calls) drops calls past it."""

    def __init__(self, max_calls: int | None = None):
        self._max_calls = max_calls
        self._buffer = ""  # text seen but not yet emitted
        self._in_call = False
        self._whitespace = ""  # held back: dropped if a call follows it
        self._before_call = ""
        self._num_calls = 0

    @property
    def num_calls(self) -> int:
        return self._num_calls

    def feed(self, text: str) -> list[dict]:
        self._buffer += text
        deltas: list[dict] = []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    return deltas
                body, self._buffer = self._buffer[:end], self._buffer[end + len(CLOSE) :]
                self._in_call = False
                deltas += self._call(body, OPEN + body + CLOSE)
                continue
            start = self._buffer.find(OPEN)
            if start >= 0:
                deltas += self._content(self._buffer[:start])
                # Whitespace right before a call is content only if the call is not one.
                self._before_call, self._whitespace = self._whitespace, ""
                self._buffer = self._buffer[start + len(OPEN) :]
                self._in_call = True
                continue
            # The end of the buffer may be the start of a tag: hold it back.
            keep = _partial_tag(self._buffer)
            deltas += self._content(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return deltas

    def finish(self) -> list[dict]:
        """What is left at the end: an unclosed call that parses (a model that stops
        right after the JSON) is a call; any other leftover is content."""
        deltas: list[dict] = []
        if self._in_call:
            body, self._buffer, self._in_call = self._buffer, "", False
            deltas += self._call(body, OPEN + body)
        deltas += self._content(self._buffer)
        self._buffer = ""
        if self._whitespace and not self._num_calls:
            deltas.append({"content": self._whitespace})
        self._whitespace = ""
        return deltas

    def _content(self, text: str) -> list[dict]:
        # Trailing whitespace waits for what follows it, whatever the chunking: the
        # same text split anywhere parses the same.
        head = text.rstrip()
        if not head:
            self._whitespace += text
            return []
        emitted = self._whitespace + head
        self._whitespace = text[len(head) :]
        return [{"content": emitted}]

    def _call(self, body: str, raw: str) -> list[dict]:
        parsed = _parse_call(body)
        before, self._before_call = self._before_call, ""
        if parsed is None:
            return self._content(before + raw)
        if self._max_calls is not None and self._num_calls >= self._max_calls:
            return []
        name, arguments = parsed
        index = self._num_calls
        self._num_calls += 1
        header = {
            "index": index,
            "id": new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return [
            {"tool_calls": [header]},
            {"tool_calls": [{"index": index, "function": {"arguments": arguments}}]},
        ]


def _partial_tag(text: str) -> int:
    """How many characters at the end of `text` could begin OPEN."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def _parse_call(body: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a call's JSON, or None if it is not one."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    # Some models write "parameters" for "arguments" (vLLM's parser takes both).
    arguments = call.get("arguments", call.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return call["name"], json.dumps(arguments, ensure_ascii=False)


def merge_deltas(deltas: list[dict]) -> ParsedMessage:
    """The message that a stream of deltas spells out (what a client reassembles)."""
    content: list[str] = []
    calls: dict[int, dict] = {}
    for delta in deltas:
        if "content" in delta:
            content.append(delta["content"])
        for piece in delta.get("tool_calls", ()):
            call = calls.setdefault(piece["index"], {"id": "", "name": "", "arguments": ""})
            call["id"] = piece.get("id") or call["id"]
            function = piece.get("function", {})
            call["name"] += function.get("name", "")
            call["arguments"] += function.get("arguments", "")
    tool_calls = [
        ToolCall(call["id"], call["name"], call["arguments"]) for _, call in sorted(calls.items())
    ]
    return ParsedMessage("".join(content) or None, tool_calls)


def parse_tool_calls(text: str, max_calls: int | None = None) -> ParsedMessage:
    """The message of a whole output: the same parse as a stream of it."""
    stream = HermesStream(max_calls)
    return merge_deltas(stream.feed(text) + stream.finish())


class PlainStream:
    """Text deltas as they are: a request whose calls are not parsed."""

    num_calls = 0

    def feed(self, text: str) -> list[dict]:
        return [{"content": text}]

    def finish(self) -> list[dict]:
        return []


def output_stream(parse_calls: bool, parallel: bool) -> HermesStream | PlainStream:
    return HermesStream(None if parallel else 1) if parse_calls else PlainStream()
