"""Turning a growing list of token ids into text deltas, in time independent of the
output's length (vLLM's incremental detokenization: a prefix offset and a read offset).

Each step decodes only a short window: the tokens from `prefix_offset` (a few tokens
already emitted, which give the new ones their context: a leading space, the rest of a
multi-byte character) to the end. The text of the window minus the text of its already
emitted part `[prefix_offset, read_offset)` is the delta.

    tokens "▁Hello" "▁wor" "ld", emitted so far "Hello wor" (read_offset 2,
    prefix_offset 1): window ["▁wor", "ld"] -> " world", its emitted part ["▁wor"] ->
    " wor", delta "ld"; then prefix_offset = 2, read_offset = 3.

A window whose text ends in an incomplete character waits for the next token (the
offsets stay, so the window grows by one token until the character is whole). The
deltas add up to the decode of the whole output (the first window starts at the first
output token, so a leading-space rule applies as it does there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_INCOMPLETE = "\ufffd"  # what a decoder yields for a multi-byte character cut short


class IncrementalDetokenizer:
    """Emits only text that is final: a trailing incomplete character waits."""

    def __init__(self, decode: Callable[[Sequence[int]], str]):
        self._decode = decode
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_ids: Sequence[int]) -> str:
        self._token_ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is left at the end, incomplete characters included."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        tokens = self._token_ids
        prefix_text = self._decode(tokens[self._prefix_offset : self._read_offset])
        window_text = self._decode(tokens[self._prefix_offset :])
        if len(window_text) <= len(prefix_text) or (
            window_text.endswith(_INCOMPLETE) and not final
        ):
            return ""
        delta = window_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(tokens)
        return delta
