"""Turning a growing list of token ids into text deltas."""

from __future__ import annotations

from collections.abc import Callable, Sequence

_INCOMPLETE = "\ufffd"  # what a decoder yields for a multi-byte character cut short


class IncrementalDetokenizer:
    """Emits only text that is final: a trailing incomplete character waits for the next
    token. Decodes the whole output each time (simple; output lengths here are small)."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._token_ids: list[int] = []
        self._emitted = ""

    def add(self, token_ids: Sequence[int]) -> str:
        self._token_ids.extend(token_ids)
        text = self._decode(self._token_ids)
        if text.endswith(_INCOMPLETE):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Whatever is left at the end, incomplete characters included."""
        return self._advance(self._decode(self._token_ids))

    def _advance(self, text: str) -> str:
        # Text already sent cannot be taken back; byte-level BPE only ever appends.
        delta = text[len(self._emitted) :]
        self._emitted = text
        return delta
