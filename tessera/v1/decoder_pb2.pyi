from tessera.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MediaSource(_message.Message):
    __slots__ = ("range", "encoder_addresses", "data", "processing_options")
    class ProcessingOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RANGE_FIELD_NUMBER: _ClassVar[int]
    ENCODER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    range: _common_pb2.PlaceholderRange
    encoder_addresses: _containers.RepeatedScalarFieldContainer[str]
    data: bytes
    processing_options: _containers.ScalarMap[str, int]
    def __init__(self, range: _Optional[_Union[_common_pb2.PlaceholderRange, _Mapping]] = ..., encoder_addresses: _Optional[_Iterable[str]] = ..., data: _Optional[bytes] = ..., processing_options: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "items", "sampling", "max_chunk_tokens", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    items: _containers.RepeatedCompositeFieldContainer[MediaSource]
    sampling: _common_pb2.SamplingParams
    max_chunk_tokens: int
    cache_salt: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., items: _Optional[_Iterable[_Union[MediaSource, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_chunk_tokens: _Optional[int] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class PrefillChunkStats(_message.Message):
    __slots__ = ("start", "end", "num_embedding_rows", "num_embedding_bytes")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    NUM_EMBEDDING_ROWS_FIELD_NUMBER: _ClassVar[int]
    NUM_EMBEDDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    num_embedding_rows: int
    num_embedding_bytes: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., num_embedding_rows: _Optional[int] = ..., num_embedding_bytes: _Optional[int] = ...) -> None: ...

class DecodeStats(_message.Message):
    __slots__ = ("chunks", "num_embedding_bytes", "num_reencoded_items", "fetch_wait_ms", "time_to_first_token_ms", "num_cached_prompt_tokens", "num_preemptions")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NUM_EMBEDDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_REENCODED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    FETCH_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[PrefillChunkStats]
    num_embedding_bytes: int
    num_reencoded_items: int
    fetch_wait_ms: float
    time_to_first_token_ms: float
    num_cached_prompt_tokens: int
    num_preemptions: int
    def __init__(self, chunks: _Optional[_Iterable[_Union[PrefillChunkStats, _Mapping]]] = ..., num_embedding_bytes: _Optional[int] = ..., num_reencoded_items: _Optional[int] = ..., fetch_wait_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ..., num_cached_prompt_tokens: _Optional[int] = ..., num_preemptions: _Optional[int] = ...) -> None: ...

class TokenBatch(_message.Message):
    __slots__ = ("token_ids", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ...) -> None: ...

class DecodeFinished(_message.Message):
    __slots__ = ("finish_reason", "usage", "stats")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    usage: _common_pb2.Usage
    stats: DecodeStats
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., stats: _Optional[_Union[DecodeStats, _Mapping]] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("tokens", "finished")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    tokens: TokenBatch
    finished: DecodeFinished
    def __init__(self, tokens: _Optional[_Union[TokenBatch, _Mapping]] = ..., finished: _Optional[_Union[DecodeFinished, _Mapping]] = ...) -> None: ...

class GetDecoderStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DecoderStats(_message.Message):
    __slots__ = ("num_running", "num_waiting", "num_kv_blocks", "num_free_kv_blocks", "num_cached_kv_blocks", "kv_block_size", "num_prefix_queries", "num_prefix_hit_blocks", "num_preemptions", "num_steps", "num_batched_tokens", "forward_seconds", "fetch_wait_seconds", "num_prefetch_pending_bytes", "num_finished", "num_aborted", "num_scheduled_requests", "num_stalls", "num_engine_errors")
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_QUERIES_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FETCH_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFETCH_PENDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_FINISHED_FIELD_NUMBER: _ClassVar[int]
    NUM_ABORTED_FIELD_NUMBER: _ClassVar[int]
    NUM_SCHEDULED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_STALLS_FIELD_NUMBER: _ClassVar[int]
    NUM_ENGINE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    num_running: int
    num_waiting: int
    num_kv_blocks: int
    num_free_kv_blocks: int
    num_cached_kv_blocks: int
    kv_block_size: int
    num_prefix_queries: int
    num_prefix_hit_blocks: int
    num_preemptions: int
    num_steps: int
    num_batched_tokens: int
    forward_seconds: float
    fetch_wait_seconds: float
    num_prefetch_pending_bytes: int
    num_finished: int
    num_aborted: int
    num_scheduled_requests: int
    num_stalls: int
    num_engine_errors: int
    def __init__(self, num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_kv_blocks: _Optional[int] = ..., num_free_kv_blocks: _Optional[int] = ..., num_cached_kv_blocks: _Optional[int] = ..., kv_block_size: _Optional[int] = ..., num_prefix_queries: _Optional[int] = ..., num_prefix_hit_blocks: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., num_steps: _Optional[int] = ..., num_batched_tokens: _Optional[int] = ..., forward_seconds: _Optional[float] = ..., fetch_wait_seconds: _Optional[float] = ..., num_prefetch_pending_bytes: _Optional[int] = ..., num_finished: _Optional[int] = ..., num_aborted: _Optional[int] = ..., num_scheduled_requests: _Optional[int] = ..., num_stalls: _Optional[int] = ..., num_engine_errors: _Optional[int] = ...) -> None: ...
