from tessera.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MediaSource(_message.Message):
    __slots__ = ("range", "encoder_addresses", "data")
    RANGE_FIELD_NUMBER: _ClassVar[int]
    ENCODER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    range: _common_pb2.PlaceholderRange
    encoder_addresses: _containers.RepeatedScalarFieldContainer[str]
    data: bytes
    def __init__(self, range: _Optional[_Union[_common_pb2.PlaceholderRange, _Mapping]] = ..., encoder_addresses: _Optional[_Iterable[str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "items", "sampling", "max_chunk_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    items: _containers.RepeatedCompositeFieldContainer[MediaSource]
    sampling: _common_pb2.SamplingParams
    max_chunk_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., items: _Optional[_Iterable[_Union[MediaSource, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_chunk_tokens: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("chunks", "num_embedding_bytes", "num_reencoded_items", "fetch_wait_ms", "time_to_first_token_ms")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NUM_EMBEDDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_REENCODED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    FETCH_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[PrefillChunkStats]
    num_embedding_bytes: int
    num_reencoded_items: int
    fetch_wait_ms: float
    time_to_first_token_ms: float
    def __init__(self, chunks: _Optional[_Iterable[_Union[PrefillChunkStats, _Mapping]]] = ..., num_embedding_bytes: _Optional[int] = ..., num_reencoded_items: _Optional[int] = ..., fetch_wait_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ...) -> None: ...

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
