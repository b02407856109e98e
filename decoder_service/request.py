"""A decode request as the engine tracks it: plain data, no tensors but its KV cache."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any

from decoder_service.grammar import GrammarMatcher, GrammarSpec
from tessera.media import ProcessingOptions
from tessera.placeholders import PlaceholderRange, atomic_chunk_end


@dataclass(frozen=True)
class MediaSource:
    """An item's range and where its rows live (with its bytes and processing options,
    to have it re-encoded)."""

    range: PlaceholderRange
    encoder_addresses: tuple[str, ...]
    data: bytes
    options: ProcessingOptions = field(default_factory=ProcessingOptions)
    cache_salt: str = ""  # the request's salt, which the content hash was made with


@dataclass(frozen=True)
class SamplingOptions:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    num_top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 0 and 1 are off
    min_p: float = 0.0
    # (token id, bias) pairs, sorted by token id (a tuple: the options are frozen).
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    # The grammar the output must follow (structured outputs); None: unconstrained.
    structured: GrammarSpec | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class DecodeSpec:
    """What a client asked for, validated."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    items: tuple[MediaSource, ...]
    sampling: SamplingOptions
    max_chunk_tokens: int
    cache_salt: str = ""
    # False: no chunk may cut an item (the family computes an item's rows together).
    split_items: bool = True

    @cached_property
    def ranges(self) -> list[PlaceholderRange]:
        return [item.range for item in self.items]


class FinishReason(Enum):
    STOP = "stop"
    LENGTH = "length"


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class SampledToken:
    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass
class ChunkRecord:
    start: int
    end: int
    num_embedding_rows: int
    num_embedding_bytes: int


@dataclass
class RequestStats:
    chunks: list[ChunkRecord] = field(default_factory=list)
    num_reencoded_items: int = 0
    fetch_wait_seconds: float = 0.0
    time_to_first_token_seconds: float | None = None
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0

    @property
    def num_embedding_bytes(self) -> int:
        return sum(chunk.num_embedding_bytes for chunk in self.chunks)


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    num_prompt_tokens: int
    num_output_tokens: int
    stats: RequestStats


# What the engine sends to a request's stream: tokens, then Finished or an exception.
Event = SampledToken | Finished | BaseException


@dataclass(eq=False)
class RequestState:
    """A request's progress. Tokens `[0, num_computed_tokens)` have their K/V in the
    cache; `[num_computed_tokens, num_tokens)` are pending. A decode step is the case of
    one pending token (the last one sampled); after a preemption every token is pending
    again and is recomputed chunk by chunk like a prompt."""

    spec: DecodeSpec
    events: asyncio.Queue[Event]
    generator: Any  # torch.Generator, made by the engine on its device
    arrival_time: float = field(default_factory=time.monotonic)
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    admitted: bool = False
    # Pending chunks whose embedding rows have arrived; set by the engine each step.
    ready_chunks: set[tuple[int, int]] = field(default_factory=set)
    # (start, end) of a prefill chunk -> task fetching its rows (owned by the Prefetcher)
    fetches: dict[tuple[int, int], asyncio.Task[Any]] = field(default_factory=dict)
    blocked_since: float | None = None
    # Content hashes of items some fetch of this request has had rows of: no encoder is
    # computing them for it any more (set by the Prefetcher).
    items_arrived: set[str] = field(default_factory=set)
    leases_released: bool = False
    finished: bool = False
    # Penalty counts (decoder_service.sampler.TokenCounts), made on the first sample.
    token_counts: Any = None
    # The request's place in its grammar (set by the engine when it has one).
    grammar: GrammarMatcher | None = None

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.spec.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.spec.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_decoding(self) -> bool:
        return bool(self.output_token_ids) and self.num_tokens - self.num_computed_tokens == 1

    def next_chunk(self, start: int | None = None) -> tuple[int, int] | None:
        """The chunk of pending tokens that begins at `start` (default: the first pending
        one), or None when nothing is pending there. Chunk boundaries are fixed by
        `max_chunk_tokens` (and, where items may not be split, by item boundaries), so
        rows can be fetched for chunks ahead exactly."""
        start = self.num_computed_tokens if start is None else start
        if start >= self.num_tokens:
            return None
        end = min(start + self.spec.max_chunk_tokens, self.num_tokens)
        if not self.spec.split_items:
            end = atomic_chunk_end(self.spec.ranges, start, end)
        return start, end

    def chunk_needs_rows(self, start: int, end: int) -> bool:
        return any(r.offset < end and start < r.end for r in self.spec.ranges)

    def token_at(self, position: int) -> int:
        prompt = self.spec.prompt_token_ids
        if position < len(prompt):
            return prompt[position]
        return self.output_token_ids[position - len(prompt)]
