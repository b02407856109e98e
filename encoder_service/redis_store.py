"""The encoder fleet's shared cache (L2): embedding rows in Redis, one key per item.

Values use `redis_format` (header, per-group tags, rows), so `get_rows` reads only the
groups covering the rows asked for. Every key has a TTL. Tags are keyed MACs when the
encoders share a key (`entry_mac`): an entry written by anyone without it is never
served. Headers must also state the model's row width and dtype.

Redis is an optimization, never a dependency (invariant 5): every public method returns
a miss (None/False) instead of raising when Redis is slow, down, refuses us or
misbehaves (`redis_guard`: a breaker with backoff, a deadline per call).

Corrupt values (bad header, wrong length, tag mismatch, another shape than the model's)
are misses, are deleted so they get recomputed, and are counted (invariant 4).

Cross-replica single-flight (invariant 2): `try_lease` takes a short-lived lease key with
SET NX PX; the owner computes and `put`s, then `release_lease`s; others `wait_for` the
value, and stop waiting as soon as the lease is gone without one (its owner died).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from encoder_service.entry_mac import UNKEYED, EntryMac
from encoder_service.redis_connection import RedisConnection, make_client
from encoder_service.redis_format import (
    DEFAULT_GROUP_ROWS,
    HEADER_BYTES,
    CorruptEntryError,
    EntryHeader,
    RowShape,
    decode_entry,
    encode_entry,
    parse_fixed_header,
    parse_header,
    row_range_for,
    rows_from_groups,
    tag_range_for,
    verify_groups,
)
from encoder_service.redis_guard import RedisGuard, RedisStoreStats
from tessera.tensor_codec import CodecError, RowBlock

log = logging.getLogger(__name__)

# v2: the redis_format version 2 layout (16-byte tags, a tagged header). Entries of the
# v1 layout live under v1 names, so they are never read: misses that expire by TTL.
KEY_PREFIX = "tessera:emb:v2"
LEASE_PREFIX = "tessera:lease:v1"
HEADER_CACHE_ENTRIES = 10_000
# wait_for polls at 10 ms, doubling to 200 ms: fast for short encodes, cheap for long ones.
POLL_START_S = 0.010
POLL_MAX_S = 0.200

# Deletes the lease only if `owner` still holds it; GET then DEL from the client would
# race with the lease expiring and another owner taking it in between.
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


class RedisStore:
    """content_hash -> RowBlock in Redis, with row-range reads, leases and a breaker."""

    def __init__(
        self,
        connection: RedisConnection,
        model_fingerprint: str,
        ttl_seconds: float,
        timeout_seconds: float,
        max_connections: int,
        *,
        mac: EntryMac = UNKEYED,
        row_shape: RowShape | None = None,
        backoff_start_seconds: float = 0.5,
        backoff_max_seconds: float = 5.0,
        group_rows: int = DEFAULT_GROUP_ROWS,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`mac` tags what is written and checks what is read; `row_shape` is the
        model's row (an entry of another width or dtype is corrupt; None: unchecked)."""
        if not model_fingerprint:
            raise ValueError("model_fingerprint must be non-empty")
        if ttl_seconds <= 0 or timeout_seconds <= 0 or max_connections < 1:
            raise ValueError("ttl_seconds and timeout_seconds must be > 0, max_connections >= 1")
        self.model_fingerprint = model_fingerprint
        self.ttl_ms = max(1, round(ttl_seconds * 1000))
        self.group_rows = group_rows
        self.mac = mac
        self.row_shape = row_shape
        self.stats = RedisStoreStats()
        self._guard = RedisGuard(
            self.stats,
            timeout_seconds,
            max_connections,
            backoff_start_seconds,
            backoff_max_seconds,
            clock,
        )
        self._guarded = self._guard.run  # every Redis operation goes through the guard
        self._headers: OrderedDict[str, EntryHeader] = OrderedDict()
        self._client = make_client(connection, timeout_seconds, max_connections)
        self._release_script = self._client.register_script(_RELEASE_LUA)
        self._renew_script = self._client.register_script(_RENEW_LUA)

    # -- keys -------------------------------------------------------------------------

    def key(self, content_hash: str) -> str:
        """The entry's name; its MAC binds it. The key id keeps encoders with other MAC
        keys (or none) apart instead of deleting each other's entries."""
        return f"{KEY_PREFIX}:{self.mac.key_id}:{self.model_fingerprint}:{content_hash}"

    def lease_key(self, content_hash: str) -> str:
        return f"{LEASE_PREFIX}:{self.model_fingerprint}:{content_hash}"

    # -- public API ---------------------------------------------------------------------

    async def get(self, content_hash: str) -> RowBlock | None:
        """The whole item, fully verified, or None (missing, corrupt or Redis down)."""
        _check_hash(content_hash)
        key = self.key(content_hash)
        value = await self._guarded(self._client.get(key), None)
        if value is None:
            self._forget(content_hash)
            return self._count(None)
        self.stats.num_bytes_read += len(value)
        try:
            # Hashing megabytes takes milliseconds; BLAKE2b releases the GIL meanwhile.
            block = await asyncio.to_thread(
                decode_entry, value, key.encode(), self.mac, self.row_shape
            )
        except CorruptEntryError as error:
            self._note_corrupt(content_hash, error)
            await self._guarded(self._client.delete(key), 0)
            return self._count(None)
        self._remember(content_hash, parse_fixed_header(value))
        return self._count(block)

    async def get_rows(self, content_hash: str, start: int, end: int) -> RowBlock | None:
        """Rows `[start, end)` of the item, reading only the groups that cover them.

        Raises CodecError if the stored item has fewer than `end` rows (a caller bug, like
        `RowBlock.rows`); returns None when the item is missing, corrupt or Redis is down.
        """
        _check_hash(content_hash)
        if not 0 <= start < end:
            raise CodecError(f"rows [{start}, {end}) is not a non-empty range")
        block = await self._guarded(self._get_rows(content_hash, start, end), None)
        return self._count(block)

    async def put(self, content_hash: str, block: RowBlock) -> bool:
        """Stores the item with the TTL; False if Redis is unavailable."""
        _check_hash(content_hash)
        key = self.key(content_hash)
        value = await asyncio.to_thread(
            encode_entry, block, self.group_rows, key.encode(), self.mac
        )
        stored = await self._guarded(self._set(key, value), False)
        if stored:
            self.stats.num_writes += 1
            self._remember(content_hash, parse_fixed_header(value))
        return stored

    async def try_lease(self, content_hash: str, owner: str, ttl_ms: int) -> bool:
        """True if `owner` now holds the item's lease (idempotent for the same owner).

        False if another owner holds it *or Redis is unavailable*; either way the caller
        may `wait_for` the value, which returns False at once while Redis is down.
        `owner` must be unique per attempt (e.g. replica id + uuid).
        """
        _check_hash(content_hash)
        return await self._guarded(self._lease(self.lease_key(content_hash), owner, ttl_ms), False)

    async def release_lease(self, content_hash: str, owner: str) -> bool:
        """Deletes the lease if `owner` still holds it; True if it did."""
        _check_hash(content_hash)
        key = self.lease_key(content_hash)
        return await self._guarded(self._release(key, owner), False)

    def known_num_rows(self, content_hash: str) -> int | None:
        """The item's row count from a header read before (by get_rows), else None."""
        header = self._headers.get(content_hash)
        return header.num_rows if header is not None else None

    async def renew_lease(self, content_hash: str, owner: str, ttl_ms: int) -> bool:
        """Extends the lease to `ttl_ms` from now if `owner` still holds it; True if so."""
        _check_hash(content_hash)
        key = self.lease_key(content_hash)
        renew = self._renew_script(keys=[key], args=[owner, max(1, int(ttl_ms))])
        return bool(await self._guarded(renew, False))

    async def wait_for(self, content_hash: str, timeout_s: float) -> bool:
        """Polls until the item's value exists (True), or until its lease is gone without
        a value, `timeout_s` passes, or Redis is unavailable (False)."""
        _check_hash(content_hash)
        deadline = time.monotonic() + timeout_s
        pause = POLL_START_S
        while True:
            state = await self._guarded(self._poll(content_hash), None)
            if state is not None and state != "waiting":
                return state == "ready"
            remaining = deadline - time.monotonic()
            if state is None or remaining <= 0:
                return False
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, POLL_MAX_S)

    async def ping(self) -> bool:
        """One PING under the breaker: while degraded, lets an idle replica notice Redis
        is back without waiting for a request to probe it."""
        return bool(await self._guarded(self._client.ping(), False))

    async def watch(self, interval_seconds: float = 1.0) -> None:
        """Pings while degraded, forever (run it as a background task)."""
        while True:
            await asyncio.sleep(interval_seconds)
            if self.stats.degraded:
                await self.ping()

    async def close(self) -> None:
        await self._client.aclose()

    # -- Redis operations (run inside _guarded) ------------------------------------------

    async def _get_rows(self, content_hash: str, start: int, end: int) -> RowBlock | None:
        cached = self._headers.get(content_hash)
        if cached is not None:
            self._headers.move_to_end(content_hash)
            try:
                return await self._read_rows(content_hash, cached, start, end)
            except _Stale:
                # The value changed under a cached header: read its header afresh.
                self._forget(content_hash)
        try:
            header = await self._read_header(content_hash)
            if header is None:
                return None
            self._remember(content_hash, header)
            return await self._read_rows(content_hash, header, start, end)
        except (CorruptEntryError, _Stale) as error:
            self._note_corrupt(content_hash, error)
            await self._client.delete(self.key(content_hash))
            return None

    async def _read_header(self, content_hash: str) -> EntryHeader | None:
        """The verified header, or None if the key is missing; CorruptEntryError if bad."""
        key = self.key(content_hash)
        pipe = self._client.pipeline(transaction=True)
        pipe.strlen(key)
        pipe.getrange(key, 0, HEADER_BYTES - 1)
        length, head = await pipe.execute()
        self.stats.num_bytes_read += len(head)
        if length == 0:
            return None
        header = self._parse(key, head)
        if length != header.value_length:
            raise CorruptEntryError(f"value is {length} bytes, header says {header.value_length}")
        return header

    async def _read_rows(
        self, content_hash: str, header: EntryHeader, start: int, end: int
    ) -> RowBlock | None:
        """Reads and verifies the groups covering `[start, end)` in one atomic round trip.

        Raises _Stale when the value's length, header or tags disagree with `header`.
        """
        if end > header.num_rows:
            raise CodecError(f"rows [{start}, {end}) outside [0, {header.num_rows})")
        byte_start, byte_end, first_group, last_group = row_range_for(header, start, end)
        tags_start, tags_end = tag_range_for(header, first_group, last_group)
        key = self.key(content_hash)
        # MULTI/EXEC: length, header, tags and rows come from one version of the value.
        # Re-reading the 41 header bytes costs no round trip and means a cached header
        # never hides a damaged or rewritten one.
        pipe = self._client.pipeline(transaction=True)
        pipe.strlen(key)
        pipe.getrange(key, 0, HEADER_BYTES - 1)
        pipe.getrange(key, tags_start, tags_end)
        pipe.getrange(key, byte_start, byte_end)
        length, head, tags, groups = await pipe.execute()
        self.stats.num_bytes_read += len(head) + len(tags) + len(groups)
        if length == 0:
            self._forget(content_hash)
            return None
        try:
            if length != header.value_length or self._parse(key, head) != header:
                raise _Stale(f"value of {length} bytes no longer matches its header")
            verify_groups(header, tags, groups, first_group, key.encode(), self.mac)
        except CorruptEntryError as error:
            raise _Stale(str(error)) from error
        return rows_from_groups(header, groups, first_group, start, end)

    def _parse(self, key: str, head: bytes) -> EntryHeader:
        return parse_header(head, key.encode(), self.mac, self.row_shape)

    async def _set(self, key: str, value: bytes) -> bool:
        return bool(await self._client.set(key, value, px=self.ttl_ms))

    async def _lease(self, key: str, owner: str, ttl_ms: int) -> bool:
        if await self._client.set(key, owner, nx=True, px=max(1, int(ttl_ms))):
            return True
        # A retried SET whose first attempt landed finds our own lease: still ours.
        return await self._client.get(key) == owner.encode()

    async def _release(self, key: str, owner: str) -> bool:
        return bool(await self._release_script(keys=[key], args=[owner]))

    async def _poll(self, content_hash: str) -> str:
        """Returns "ready", "waiting" (leased, no value yet) or "abandoned" (neither)."""
        # Lease first, then value: an owner puts before it releases, so a lease seen gone
        # here means any value it wrote is already visible to the second read.
        leased = await self._client.exists(self.lease_key(content_hash))
        if await self._client.exists(self.key(content_hash)):
            return "ready"
        return "waiting" if leased else "abandoned"

    # -- bookkeeping ---------------------------------------------------------------------

    def _count(self, block: RowBlock | None) -> RowBlock | None:
        if block is None:
            self.stats.num_misses += 1
        else:
            self.stats.num_hits += 1
        return block

    def _note_corrupt(self, content_hash: str, error: Exception) -> None:
        """Counts and forgets a corrupt entry; the caller deletes it so it is recomputed."""
        self.stats.num_corrupt += 1
        self._forget(content_hash)
        log.warning("deleting corrupt redis entry %s: %s", self.key(content_hash), error)

    def _remember(self, content_hash: str, header: EntryHeader) -> None:
        self._headers[content_hash] = header
        self._headers.move_to_end(content_hash)
        while len(self._headers) > HEADER_CACHE_ENTRIES:
            self._headers.popitem(last=False)

    def _forget(self, content_hash: str) -> None:
        self._headers.pop(content_hash, None)


class _Stale(Exception):
    """A value that disagrees with the header used to read it."""


def _check_hash(content_hash: str) -> None:
    if not isinstance(content_hash, str) or not content_hash:
        raise ValueError(f"content_hash must be a non-empty str, got {content_hash!r}")
