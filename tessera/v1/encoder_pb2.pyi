from tessera.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodeSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODE_SOURCE_UNSPECIFIED: _ClassVar[EncodeSource]
    ENCODE_SOURCE_COMPUTED: _ClassVar[EncodeSource]
    ENCODE_SOURCE_MEMORY: _ClassVar[EncodeSource]
    ENCODE_SOURCE_JOINED: _ClassVar[EncodeSource]
    ENCODE_SOURCE_REDIS: _ClassVar[EncodeSource]
ENCODE_SOURCE_UNSPECIFIED: EncodeSource
ENCODE_SOURCE_COMPUTED: EncodeSource
ENCODE_SOURCE_MEMORY: EncodeSource
ENCODE_SOURCE_JOINED: EncodeSource
ENCODE_SOURCE_REDIS: EncodeSource

class EncodeRequest(_message.Message):
    __slots__ = ("items", "lease_owner", "lease_ms", "model_fingerprint")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_common_pb2.MediaItem]
    lease_owner: str
    lease_ms: int
    model_fingerprint: str
    def __init__(self, items: _Optional[_Iterable[_Union[_common_pb2.MediaItem, _Mapping]]] = ..., lease_owner: _Optional[str] = ..., lease_ms: _Optional[int] = ..., model_fingerprint: _Optional[str] = ...) -> None: ...

class EncodedItem(_message.Message):
    __slots__ = ("content_hash", "num_rows", "hidden_size", "dtype", "source")
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    content_hash: str
    num_rows: int
    hidden_size: int
    dtype: str
    source: EncodeSource
    def __init__(self, content_hash: _Optional[str] = ..., num_rows: _Optional[int] = ..., hidden_size: _Optional[int] = ..., dtype: _Optional[str] = ..., source: _Optional[_Union[EncodeSource, str]] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[EncodedItem]
    def __init__(self, items: _Optional[_Iterable[_Union[EncodedItem, _Mapping]]] = ...) -> None: ...

class RowSlice(_message.Message):
    __slots__ = ("content_hash", "start", "end", "item_num_rows")
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    ITEM_NUM_ROWS_FIELD_NUMBER: _ClassVar[int]
    content_hash: str
    start: int
    end: int
    item_num_rows: int
    def __init__(self, content_hash: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., item_num_rows: _Optional[int] = ...) -> None: ...

class GetEmbeddingSlicesRequest(_message.Message):
    __slots__ = ("slices", "lease_owner", "lease_ms")
    SLICES_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedCompositeFieldContainer[RowSlice]
    lease_owner: str
    lease_ms: int
    def __init__(self, slices: _Optional[_Iterable[_Union[RowSlice, _Mapping]]] = ..., lease_owner: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class EmbeddingSlice(_message.Message):
    __slots__ = ("content_hash", "start", "rows")
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    content_hash: str
    start: int
    rows: _common_pb2.TensorBytes
    def __init__(self, content_hash: _Optional[str] = ..., start: _Optional[int] = ..., rows: _Optional[_Union[_common_pb2.TensorBytes, _Mapping]] = ...) -> None: ...

class EmbeddingRows(_message.Message):
    __slots__ = ("first_row", "dtype", "row_width", "data")
    FIRST_ROW_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ROW_WIDTH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    first_row: int
    dtype: str
    row_width: int
    data: bytes
    def __init__(self, first_row: _Optional[int] = ..., dtype: _Optional[str] = ..., row_width: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReleaseLeasesRequest(_message.Message):
    __slots__ = ("lease_owner", "content_hashes")
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASHES_FIELD_NUMBER: _ClassVar[int]
    lease_owner: str
    content_hashes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_owner: _Optional[str] = ..., content_hashes: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseLeasesResponse(_message.Message):
    __slots__ = ("num_released",)
    NUM_RELEASED_FIELD_NUMBER: _ClassVar[int]
    num_released: int
    def __init__(self, num_released: _Optional[int] = ...) -> None: ...

class ExpediteRequest(_message.Message):
    __slots__ = ("content_hashes", "decoder_id", "sequence")
    CONTENT_HASHES_FIELD_NUMBER: _ClassVar[int]
    DECODER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    content_hashes: _containers.RepeatedScalarFieldContainer[str]
    decoder_id: str
    sequence: int
    def __init__(self, content_hashes: _Optional[_Iterable[str]] = ..., decoder_id: _Optional[str] = ..., sequence: _Optional[int] = ...) -> None: ...

class ExpediteResponse(_message.Message):
    __slots__ = ("num_in_flight",)
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    num_in_flight: int
    def __init__(self, num_in_flight: _Optional[int] = ...) -> None: ...

class GetEncoderStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EncoderStats(_message.Message):
    __slots__ = ("num_items_requested", "num_items_computed", "num_memory_hits", "num_joined_in_flight", "num_slice_misses", "num_bytes_served", "num_evictions", "num_cached_items", "num_cached_bytes", "num_batches", "num_redis_hits", "num_remote_waits", "num_corrupt_entries", "num_redis_errors", "degraded", "num_batched_items", "max_batch_size", "redis_enabled", "num_pinned_bytes", "num_pins_refused", "num_hashes_verified", "num_hashes_trusted", "num_slice_calls", "num_pixel_values_used", "num_pixel_values_ignored", "num_expedite_calls", "num_expedited_batches", "num_batcher_errors")
    NUM_ITEMS_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    NUM_ITEMS_COMPUTED_FIELD_NUMBER: _ClassVar[int]
    NUM_MEMORY_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_JOINED_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_SLICE_MISSES_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_SERVED_FIELD_NUMBER: _ClassVar[int]
    NUM_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCHES_FIELD_NUMBER: _ClassVar[int]
    NUM_REDIS_HITS_FIELD_NUMBER: _ClassVar[int]
    NUM_REMOTE_WAITS_FIELD_NUMBER: _ClassVar[int]
    NUM_CORRUPT_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NUM_REDIS_ERRORS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCHED_ITEMS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    REDIS_ENABLED_FIELD_NUMBER: _ClassVar[int]
    NUM_PINNED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_PINS_REFUSED_FIELD_NUMBER: _ClassVar[int]
    NUM_HASHES_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    NUM_HASHES_TRUSTED_FIELD_NUMBER: _ClassVar[int]
    NUM_SLICE_CALLS_FIELD_NUMBER: _ClassVar[int]
    NUM_PIXEL_VALUES_USED_FIELD_NUMBER: _ClassVar[int]
    NUM_PIXEL_VALUES_IGNORED_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPEDITE_CALLS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPEDITED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    NUM_BATCHER_ERRORS_FIELD_NUMBER: _ClassVar[int]
    num_items_requested: int
    num_items_computed: int
    num_memory_hits: int
    num_joined_in_flight: int
    num_slice_misses: int
    num_bytes_served: int
    num_evictions: int
    num_cached_items: int
    num_cached_bytes: int
    num_batches: int
    num_redis_hits: int
    num_remote_waits: int
    num_corrupt_entries: int
    num_redis_errors: int
    degraded: bool
    num_batched_items: int
    max_batch_size: int
    redis_enabled: bool
    num_pinned_bytes: int
    num_pins_refused: int
    num_hashes_verified: int
    num_hashes_trusted: int
    num_slice_calls: int
    num_pixel_values_used: int
    num_pixel_values_ignored: int
    num_expedite_calls: int
    num_expedited_batches: int
    num_batcher_errors: int
    def __init__(self, num_items_requested: _Optional[int] = ..., num_items_computed: _Optional[int] = ..., num_memory_hits: _Optional[int] = ..., num_joined_in_flight: _Optional[int] = ..., num_slice_misses: _Optional[int] = ..., num_bytes_served: _Optional[int] = ..., num_evictions: _Optional[int] = ..., num_cached_items: _Optional[int] = ..., num_cached_bytes: _Optional[int] = ..., num_batches: _Optional[int] = ..., num_redis_hits: _Optional[int] = ..., num_remote_waits: _Optional[int] = ..., num_corrupt_entries: _Optional[int] = ..., num_redis_errors: _Optional[int] = ..., degraded: _Optional[bool] = ..., num_batched_items: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., redis_enabled: _Optional[bool] = ..., num_pinned_bytes: _Optional[int] = ..., num_pins_refused: _Optional[int] = ..., num_hashes_verified: _Optional[int] = ..., num_hashes_trusted: _Optional[int] = ..., num_slice_calls: _Optional[int] = ..., num_pixel_values_used: _Optional[int] = ..., num_pixel_values_ignored: _Optional[int] = ..., num_expedite_calls: _Optional[int] = ..., num_expedited_batches: _Optional[int] = ..., num_batcher_errors: _Optional[int] = ...) -> None: ...
