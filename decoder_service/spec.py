"""Checking a DecodeRequest and turning it into a DecodeSpec; every problem is a
ValueError whose message says what to fix."""

from __future__ import annotations

from dataclasses import replace

from decoder_service.grammar import grammar_spec_from_proto
from decoder_service.kv_cache import KVCacheManager
from decoder_service.request import DecodeSpec, MediaSource, SamplingOptions
from tessera.adapters import ModelFamily
from tessera.hashing import is_content_hash
from tessera.limits import MAX_ENCODER_HINTS, check_cache_salt, check_request_id
from tessera.media import ProcessingOptions
from tessera.placeholders import validate_ranges
from tessera.sampling import check_sampling, check_token_ids, effective_temperature
from tessera.v1 import common_pb2, decoder_pb2
from tessera.wire import range_from_proto


def sampling_from_proto(
    message: common_pb2.SamplingParams,
    default_max_tokens: int,
    max_new_tokens: int,
    vocab_size: int,
) -> SamplingOptions:
    """`max_new_tokens` is what the context leaves after the prompt."""
    check_sampling(message)
    check_token_ids(message, vocab_size)
    if message.max_tokens > max_new_tokens:
        raise ValueError(
            f"max_tokens {message.max_tokens} exceeds what the context leaves after the "
            f"prompt ({max_new_tokens}); lower max_tokens or shorten the prompt"
        )
    max_tokens = message.max_tokens or min(default_max_tokens, max_new_tokens)
    if message.min_tokens > max_tokens:
        raise ValueError(
            f"min_tokens ({message.min_tokens}) must be <= max_tokens ({max_tokens}, "
            "the default when unset)"
        )
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=effective_temperature(message.temperature),
        top_p=message.top_p or 1.0,
        top_k=message.top_k,
        seed=message.seed if message.HasField("seed") else None,
        stop_token_ids=frozenset(message.stop_token_ids),
        ignore_eos=message.ignore_eos,
        num_top_logprobs=message.num_top_logprobs,
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
        repetition_penalty=message.repetition_penalty or 1.0,
        min_p=message.min_p,
        logit_bias=tuple(sorted(message.logit_bias.items())),
        min_tokens=message.min_tokens,
        structured=grammar_spec_from_proto(message.structured_output),
    )


def spec_from_proto(
    message: decoder_pb2.DecodeRequest,
    family: ModelFamily,
    max_model_len: int,
    max_chunk_tokens: int,
    default_max_tokens: int,
) -> DecodeSpec:
    if not message.request_id:
        raise ValueError("request_id is empty; give every request an id")
    check_request_id(message.request_id, "request_id")
    prompt = tuple(message.prompt_token_ids)
    if not prompt:
        raise ValueError("prompt_token_ids is empty")
    if len(prompt) >= max_model_len:
        raise ValueError(
            f"the prompt has {len(prompt)} tokens; this model's context is {max_model_len} "
            "(including at least one generated token): shorten it or send fewer images"
        )
    too_large = [t for t in prompt if t >= family.vocab_size]
    if too_large:
        raise ValueError(
            f"token id {too_large[0]} is outside the vocabulary (size {family.vocab_size})"
        )
    cache_salt = check_cache_salt(message.cache_salt)
    items = _share_data(
        [_media_source(index, item, family, cache_salt) for index, item in enumerate(message.items)]
    )
    validate_ranges([i.range for i in items], prompt, family.placeholder_token_ids)
    chunk = message.max_chunk_tokens
    return DecodeSpec(
        request_id=message.request_id,
        prompt_token_ids=prompt,
        items=tuple(items),
        sampling=sampling_from_proto(
            message.sampling, default_max_tokens, max_model_len - len(prompt), family.vocab_size
        ),
        max_chunk_tokens=min(chunk, max_chunk_tokens) if chunk else max_chunk_tokens,
        cache_salt=cache_salt,
        split_items=family.attention.split_items,
    )


def _media_source(
    index: int, item: decoder_pb2.MediaSource, family: ModelFamily, cache_salt: str
) -> MediaSource:
    try:
        placeholder = range_from_proto(item.range)
        options = ProcessingOptions.of(item.processing_options)
        family.check_options(options)
    except ValueError as error:
        raise ValueError(f"item {index}: {error}") from None
    if not is_content_hash(placeholder.content_hash):
        raise ValueError(f"item {index}: {placeholder.content_hash!r} is not a content hash")
    if len(item.encoder_addresses) > MAX_ENCODER_HINTS:
        raise ValueError(
            f"item {index} names {len(item.encoder_addresses)} encoder addresses; "
            f"at most {MAX_ENCODER_HINTS}"
        )
    family.check_layout(placeholder)
    return MediaSource(placeholder, tuple(item.encoder_addresses), item.data, options, cache_salt)


def _share_data(items: list[MediaSource]) -> list[MediaSource]:
    """Items sent without bytes take those of the earlier item of their content hash
    (one video's ranges, an image sent twice): the request carries each item's bytes once.
    Raises ValueError for an item with no bytes of its own and no earlier namesake."""
    first: dict[str, MediaSource] = {}
    shared = []
    for index, item in enumerate(items):
        name = item.range.content_hash
        if item.data:
            first.setdefault(name, item)
        elif name in first:
            item = replace(item, data=first[name].data)
        else:
            raise ValueError(
                f"item {index} has no data and no earlier item has its content hash {name}; "
                "send the item's bytes with its first range"
            )
        shared.append(item)
    return shared


def check_fits(spec: DecodeSpec, kv: KVCacheManager, max_num_batched_tokens: int) -> None:
    """Refuses a request that could never fit in the whole KV cache, or whose items
    cannot be split and do not fit in one step."""
    if not spec.split_items:
        for index, item in enumerate(spec.items):
            if item.range.length > max_num_batched_tokens:
                raise ValueError(
                    f"item {index} has {item.range.length} rows; this model computes an item "
                    f"in one step, and the decoder's steps hold at most "
                    f"{max_num_batched_tokens} tokens (--max-num-batched-tokens)"
                )
    num_tokens = len(spec.prompt_token_ids) + spec.sampling.max_tokens
    if kv.blocks_for(num_tokens) > kv.num_blocks:
        raise ValueError(
            f"prompt + max_tokens = {num_tokens} tokens need more than the decoder's whole "
            f"KV cache ({kv.num_blocks * kv.block_size} tokens): lower max_tokens or shorten "
            "the prompt"
        )
