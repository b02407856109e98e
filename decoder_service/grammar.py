"""Structured outputs: a grammar (JSON Schema, any JSON object, regex, Lark) applied as a
token mask, with llguidance doing the parsing.

Entry points (stable; the engine and the tool-calling path use only these):

- `grammar_spec_from_proto(message)`: a `StructuredOutput` proto -> `GrammarSpec` (or None
  for "unconstrained"); checks the oneof and the text's size. Raises ValueError naming
  `structured_output`.
- `GrammarCompiler(tokenizer, model_vocab_size, eos_token_ids)`, one per decoder (or
  `GrammarCompiler.for_family(family)`): `matcher(spec)` compiles (cached by text, bounded
  LRU) and returns a fresh per-request `GrammarMatcher`; a bad grammar raises ValueError
  naming `structured_output` with llguidance's message. Compiling can take a while for a
  large grammar: call it off the event loop (`asyncio.to_thread`).
- `GrammarMatcher`, one per request, used once per sampled token:
  `allowed_tokens(vocab_size)` -> bool mask of the model's vocabulary (before sampling),
  `advance(token_id)` (after sampling), `is_terminated` (the grammar is complete and takes
  nothing more: the request finishes with reason "stop").
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy  # not llguidance.torch: its import runs torch.compile's stack (~3 s)
import numpy
import torch

from tessera.grammar_spec import (  # noqa: F401 (the engine's entry points, re-exported)
    GrammarKind,
    GrammarSpec,
    grammar_spec_from_proto,
    grammar_text,
)

# A caller is hostile: the text is bounded (tessera.limits.MAX_GRAMMAR_CHARS) before
# anything parses it, and llguidance's own limits bound what compiling and each step's
# mask may cost.
GRAMMAR_CACHE_SIZE = 64
_LIMITS = dict(
    max_items_in_row=2000,
    initial_lexer_fuel=1_000_000,  # ~20 ms of building the lexer
    step_lexer_fuel=200_000,  # ~15 ms per token's mask
    step_max_items=50_000,
    max_lexer_states=250_000,
    max_grammar_size=200_000,
    # Errors go back to the caller; the grammar's internals need not.
    verbose_errors=False,
)
_BIT_POSITIONS = torch.arange(32, dtype=torch.int32)


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer_vocab_size: int):
        self._matcher = matcher
        self._tokenizer_vocab_size = tokenizer_vocab_size
        # llguidance fills the numpy array; torch reads the same memory (from_numpy).
        self._words = llguidance.numpy.allocate_token_bitmask(1, tokenizer_vocab_size)

    def allowed_tokens(self, vocab_size: int) -> torch.Tensor:
        """A bool mask over the model's `vocab_size` logits: True where the grammar lets
        the token come next. Ids the tokenizer does not have (a model's vocabulary is often
        padded past it) are never allowed."""
        self._raise_if_error()
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._words, 0)
        return self._unpack(torch.from_numpy(self._words)[0], vocab_size)

    def _unpack(self, words: torch.Tensor, vocab_size: int) -> torch.Tensor:
        # Unpacked here rather than with llguidance.torch.apply_token_bitmask_inplace,
        # which torch.compile's (seconds of compiling per process, a C compiler on CPU).
        bits = ((words.unsqueeze(-1) >> _BIT_POSITIONS) & 1).flatten().bool()
        allowed = torch.zeros(vocab_size, dtype=torch.bool)
        known = min(vocab_size, self._tokenizer_vocab_size)
        allowed[:known] = bits[:known]
        if not bool(allowed.any()):
            raise RuntimeError("the grammar allows no token of this model's vocabulary")
        return allowed

    def advance(self, token_id: int) -> None:
        """Moves past the sampled token; a token the grammar refuses is an error."""
        if not self._matcher.consume_token(token_id):
            raise RuntimeError(f"the grammar refused token {token_id}: {self._matcher.get_error()}")

    @property
    def is_terminated(self) -> bool:
        """The output is complete: the grammar takes no more tokens (or took EOS)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    @property
    def is_accepting(self) -> bool:
        return self._matcher.is_accepting()

    def _raise_if_error(self) -> None:
        if self._matcher.is_error():
            raise RuntimeError(f"the grammar matcher failed: {self._matcher.get_error()}")


def allowed_tokens_batch(matchers: Sequence[GrammarMatcher], vocab_size: int) -> list[torch.Tensor]:
    """`allowed_tokens` of every matcher, their masks filled in one parallel call
    (llguidance's thread pool) instead of one after another. Raises if any matcher fails;
    the caller then asks each alone, so only the failing request ends."""
    for matcher in matchers:
        matcher._raise_if_error()
    vocab = max(m._tokenizer_vocab_size for m in matchers)
    words: numpy.ndarray = llguidance.numpy.allocate_token_bitmask(len(matchers), vocab)
    pairs = [(matcher._matcher, row) for row, matcher in enumerate(matchers)]
    llguidance.numpy.fill_next_token_bitmask_par(_executor(), pairs, words)
    bitmask = torch.from_numpy(words)
    width = bitmask.shape[1]
    return [
        m._unpack(bitmask[row, : min(width, -(-m._tokenizer_vocab_size // 32))], vocab_size)
        for row, m in enumerate(matchers)
    ]


@functools.cache
def _executor() -> llguidance.LLExecutor:
    return llguidance.LLExecutor()


class GrammarCompiler:
    """Compiles grammars for one tokenizer; a compiled grammar is kept (LRU, by its text)
    and each request gets its own copy of its matcher. Thread-safe."""

    def __init__(
        self,
        tokenizer: Any,
        model_vocab_size: int,
        eos_token_ids: Sequence[int],
        cache_size: int = GRAMMAR_CACHE_SIZE,
    ):
        self._hf_tokenizer = tokenizer
        self.model_vocab_size = model_vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_error: str | None = None

    @classmethod
    def for_family(cls, family: Any) -> GrammarCompiler:
        """The decoder's: the family's tokenizer, model vocabulary and EOS ids. Cheap; the
        tokenizer is converted on first use (about a second for a large vocabulary)."""
        return cls(getattr(family, "tokenizer", None), family.vocab_size, family.eos_token_ids)

    def matcher(self, spec: GrammarSpec) -> GrammarMatcher:
        """A fresh matcher at the start of `spec`'s grammar. Raises ValueError naming
        `structured_output` when the grammar is bad or this model cannot take one."""
        tokenizer = self._tokenizer()
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
        if compiled is None:
            compiled = self._compile(spec, tokenizer)
            with self._lock:
                self._cache[spec] = compiled
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return GrammarMatcher(compiled.deep_copy(), tokenizer.vocab_size)

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    def _compile(
        self, spec: GrammarSpec, tokenizer: llguidance.LLTokenizer
    ) -> llguidance.LLMatcher:
        try:
            grammar = grammar_text(spec)
        except ValueError as error:  # e.g. a schema that is not JSON
            raise ValueError(f"structured_output.{spec.kind.value}: {error}") from None
        matcher = llguidance.LLMatcher(
            tokenizer, grammar, log_level=0, limits=llguidance.LLParserLimits(**_LIMITS)
        )
        if matcher.is_error():
            raise ValueError(f"structured_output.{spec.kind.value}: {matcher.get_error()}")
        return matcher

    def _tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None and self._tokenizer_error is None:
                try:
                    self._ll_tokenizer = llguidance.hf.from_tokenizer(
                        self._hf_tokenizer, eos_token=self._eos_token_ids or None
                    )
                except Exception as error:  # a tokenizer llguidance cannot read
                    self._tokenizer_error = str(error) or type(error).__name__
            if self._ll_tokenizer is None:
                raise ValueError(
                    "structured_output is not supported for this model's tokenizer "
                    f"({self._tokenizer_error})"
                )
            return self._ll_tokenizer
