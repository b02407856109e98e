"""The L2 Redis store against real Redis: round trips, row-range reads that fetch only the
groups they need, a TTL on every key, corrupt entries dropped (invariant 4), the
cross-replica lease (invariant 2), and Redis down, restarted or paused never failing a
call (invariant 5).

Tests share the Redis at 127.0.0.1:6379 under a random model fingerprint each; tests that
kill or pause Redis start their own `redis-server` on a free port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from encoder_service.entry_mac import MAC_BYTES
from encoder_service.redis_connection import RedisConnection
from encoder_service.redis_format import (
    HEADER_BYTES,
    encode_entry,
    parse_fixed_header,
    row_range_for,
)
from encoder_service.redis_store import RedisStore
from tessera.tensor_codec import CodecError, RowBlock
from tessera.testbed.clock import ManualClock
from tessera.testbed.redis_server import PrivateRedis

SHARED_URL = "redis://127.0.0.1:6379/0"
T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def block_of(num_rows: int, hidden: int, dtype: str = "float16") -> RowBlock:
    size = {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]
    return RowBlock(dtype, num_rows, hidden, os.urandom(num_rows * hidden * size))


@pytest.fixture
def raw() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(SHARED_URL)
    yield client
    client.close()


@pytest.fixture
def fingerprint(raw: redis.Redis) -> Iterator[str]:
    name = f"test-{uuid.uuid4().hex}"
    yield name
    for key in raw.scan_iter(match=f"tessera:*:{name}:*"):
        raw.delete(key)


def make_store(
    fingerprint: str,
    url: str = SHARED_URL,
    cluster: bool = False,
    connection: RedisConnection | None = None,
    **options: Any,
) -> RedisStore:
    settings: dict[str, Any] = {
        "ttl_seconds": 60,
        "timeout_seconds": 1.0,
        "max_connections": 8,
    }
    settings.update(options)
    return RedisStore(connection or RedisConnection(url, cluster), fingerprint, **settings)


def with_store(fingerprint: str, body: Callable[[RedisStore], Awaitable[T]], **options: Any) -> T:
    async def go() -> T:
        store = make_store(fingerprint, **options)
        try:
            return await body(store)
        finally:
            await store.close()

    return run(go())


# -- round trips and row ranges --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_put_get_round_trip(fingerprint: str, dtype: str) -> None:
    block = block_of(33, 24, dtype)

    async def body(store: RedisStore) -> None:
        assert await store.get("nothing-here") is None
        assert await store.put("item", block)
        assert await store.get("item") == block
        assert (store.stats.num_hits, store.stats.num_misses, store.stats.num_writes) == (1, 1, 1)
        assert store.stats.num_corrupt == store.stats.num_errors == 0

    with_store(fingerprint, body)


LARGE = (1000, 1024)  # float16: 2 KiB rows, a 2 MB value
RANGES = {"start": (0, 10), "middle": (500, 530), "end": (990, 1000), "boundary": (15, 17)}


def expected_bytes_read(block: RowBlock, start: int, end: int, cached_header: bool) -> int:
    """The header and its tag (twice unless cached: once to learn the layout, once with
    the rows to check it is unchanged) + the covering groups' tags + their rows."""
    header = parse_fixed_header(encode_entry(block))
    byte_start, byte_end, first, last = row_range_for(header, start, end)
    header_bytes = HEADER_BYTES * (1 if cached_header else 2)
    return header_bytes + MAC_BYTES * (last - first + 1) + byte_end - byte_start + 1


@pytest.mark.parametrize("name", list(RANGES))
def test_get_rows_reads_only_the_groups_it_needs(fingerprint: str, name: str) -> None:
    start, end = RANGES[name]
    block = block_of(*LARGE)
    value_size = len(encode_entry(block))

    async def body(store: RedisStore) -> None:
        writer = make_store(fingerprint)
        assert await writer.put("big", block)
        await writer.close()
        for cached in (False, True):  # a fresh store reads the header; then it is cached
            before = store.stats.num_bytes_read
            assert await store.get_rows("big", start, end) == block.rows(start, end)
            read = store.stats.num_bytes_read - before
            assert read == expected_bytes_read(block, start, end, cached)
            assert read < value_size // 20
        assert store.stats.num_hits == 2 and store.stats.num_corrupt == 0

    with_store(fingerprint, body)


def test_get_rows_outside_the_item_is_a_caller_error(fingerprint: str) -> None:
    async def body(store: RedisStore) -> None:
        await store.put("item", block_of(20, 8))
        with pytest.raises(CodecError):
            await store.get_rows("item", 10, 21)
        with pytest.raises(CodecError):
            await store.get_rows("item", 5, 5)
        assert await store.get_rows("missing", 0, 1) is None

    with_store(fingerprint, body)


def test_cached_header_of_a_rewritten_value_is_refreshed(fingerprint: str) -> None:
    """Another replica rewrites the item with another group size (so another length):
    the stale cached header is dropped and the read succeeds, nothing counted corrupt."""
    block = block_of(100, 16)

    async def body(store: RedisStore) -> None:
        await store.put("item", block)
        assert await store.get_rows("item", 40, 60) == block.rows(40, 60)
        other = make_store(fingerprint, group_rows=7)
        await other.put("item", block)
        await other.close()
        assert await store.get_rows("item", 40, 60) == block.rows(40, 60)
        assert store.stats.num_corrupt == 0

    with_store(fingerprint, body)


def test_pool_limit_queues_instead_of_failing(fingerprint: str) -> None:
    """Many concurrent reads through a 2-connection pool: all hits, no errors."""
    block = block_of(64, 32)

    async def body(store: RedisStore) -> None:
        await store.put("item", block)
        results = await asyncio.gather(*(store.get_rows("item", i, i + 1) for i in range(64)))
        assert results == [block.rows(i, i + 1) for i in range(64)]
        assert store.stats.num_errors == 0 and not store.stats.degraded

    with_store(fingerprint, body, max_connections=2)


def test_every_key_has_a_ttl(fingerprint: str, raw: redis.Redis) -> None:
    async def body(store: RedisStore) -> None:
        await store.put("item", block_of(4, 4))
        await store.try_lease("other", "me", 5000)

    with_store(fingerprint, body, ttl_seconds=30)
    keys = list(raw.scan_iter(match=f"tessera:*:{fingerprint}:*"))
    assert len(keys) == 2
    ttls = {key.decode().split(":")[1]: raw.pttl(key) for key in keys}
    assert 0 < ttls["emb"] <= 30_000
    assert 0 < ttls["lease"] <= 5_000


# -- corrupt entries --------------------------------------------------------------------------


def corrupt_value(good: bytes, kind: str, other: bytes) -> bytes:
    header = parse_fixed_header(good)
    value = bytearray(good)
    if kind == "flipped row byte":
        value[header.header_length + 12 * header.row_bytes + 3] ^= 0x10  # row 12, group 1
    elif kind == "flipped checksum byte":
        value[HEADER_BYTES + MAC_BYTES + 2] ^= 0x01  # group 1's tag
    elif kind == "truncated":
        del value[-5:]
    elif kind == "wrong dtype byte":
        value[6] = 9
    elif kind == "float16 relabelled bfloat16":
        value[6] = 3
    elif kind == "garbage":
        return b"not an embedding at all"
    elif kind == "copied from another key":
        return other
    return bytes(value)


CORRUPTIONS = [
    "flipped row byte",
    "flipped checksum byte",
    "truncated",
    "wrong dtype byte",
    "float16 relabelled bfloat16",
    "garbage",
    "copied from another key",
]


@pytest.mark.parametrize("read", ["get", "get_rows", "get_rows after caching"])
@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupt_entries_are_misses_and_deleted(
    fingerprint: str, raw: redis.Redis, kind: str, read: str
) -> None:
    block = block_of(40, 8, "float16")  # groups of 8 rows: rows 8..15 are group 1

    async def body(store: RedisStore) -> None:
        await store.put("item", block)
        await store.put("itex", block)  # same key length: only the key bytes differ
        if read == "get_rows after caching":
            assert await store.get_rows("item", 0, 40) == block
        key = store.key("item")
        raw.set(key, corrupt_value(raw.get(key), kind, raw.get(store.key("itex"))), px=60_000)
        corrupt_before = store.stats.num_corrupt
        if read == "get":
            assert await store.get("item") is None
        else:
            assert await store.get_rows("item", 10, 14) is None  # inside group 1
        assert raw.exists(key) == 0
        assert store.stats.num_corrupt == corrupt_before + 1
        assert store.stats.num_errors == 0
        # and the item can be stored again and read back
        assert await store.put("item", block)
        assert await store.get_rows("item", 10, 14) == block.rows(10, 14)

    with_store(fingerprint, body, group_rows=8)


# -- leases -----------------------------------------------------------------------------------


def test_only_one_owner_gets_the_lease(fingerprint: str, raw: redis.Redis) -> None:
    async def body(store: RedisStore) -> None:
        results = await asyncio.gather(
            *(store.try_lease("item", f"owner-{i}", 5000) for i in range(10))
        )
        assert sum(results) == 1
        winner = f"owner-{results.index(True)}"
        loser = "owner-1" if winner != "owner-1" else "owner-2"
        assert await store.try_lease("item", winner, 5000)  # idempotent for its holder
        assert not await store.release_lease("item", loser)
        assert raw.get(store.lease_key("item")) == winner.encode()
        assert await store.release_lease("item", winner)
        assert raw.exists(store.lease_key("item")) == 0
        assert await store.try_lease("item", loser, 5000)

    with_store(fingerprint, body)


def test_lease_runs_out(fingerprint: str, raw: redis.Redis) -> None:
    async def body(store: RedisStore) -> None:
        assert await store.try_lease("item", "a", 60_000)
        assert not await store.try_lease("item", "b", 60_000)
        # Its time runs out (Redis's own expiry, not a sleep that hopes to outlast it).
        raw.pexpire(store.lease_key("item"), 1)
        while raw.exists(store.lease_key("item")):
            await asyncio.sleep(0.01)
        assert await store.try_lease("item", "b", 60_000)

    with_store(fingerprint, body)


def test_wait_for_sees_the_value_another_owner_puts(fingerprint: str) -> None:
    block = block_of(8, 8)

    async def body(store: RedisStore) -> None:
        assert await store.try_lease("item", "owner", 5000)

        async def owner() -> None:
            await asyncio.sleep(0.2)  # wait_for polls a while first (any length would do)
            await store.put("item", block)
            await store.release_lease("item", "owner")

        task = asyncio.create_task(owner())
        assert await store.wait_for("item", timeout_s=60)
        assert task.done(), "wait_for returned before the value was there"
        await task
        assert await store.get("item") == block

    with_store(fingerprint, body)


@pytest.mark.parametrize("how", ["released", "expired"])
def test_wait_for_gives_up_when_the_lease_goes_without_a_value(
    fingerprint: str, how: str, raw: redis.Redis
) -> None:
    async def body(store: RedisStore) -> None:
        assert await store.try_lease("item", "owner", 200 if how == "expired" else 60_000)
        if how == "released":
            asyncio.get_running_loop().call_later(
                0.2, lambda: asyncio.ensure_future(store.release_lease("item", "owner"))
            )
        # Its own timeout is far off: returning at all means it saw the lease go (the
        # outer 60 s only turns a hang into a failure).
        assert not await asyncio.wait_for(store.wait_for("item", timeout_s=600), 60)
        assert raw.exists(store.lease_key("item")) == 0, "gave up while the lease was held"

    with_store(fingerprint, body)


def test_wait_for_times_out_while_the_lease_is_held(fingerprint: str, raw: redis.Redis) -> None:
    async def body(store: RedisStore) -> None:
        assert await store.try_lease("item", "owner", 60_000)
        started = time.monotonic()
        assert not await asyncio.wait_for(store.wait_for("item", timeout_s=0.3), 60)
        assert time.monotonic() - started >= 0.3, "gave up before its timeout"
        assert raw.exists(store.lease_key("item")) == 1

    with_store(fingerprint, body)


# -- Redis down, restarted, paused: a private server --------------------------------------


@pytest.fixture
def private(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    try:
        yield server
    finally:
        server.kill()


def test_cluster_mode(tmp_path: Path) -> None:
    """The same calls through RedisCluster, against a one-node cluster."""
    server = PrivateRedis(tmp_path, cluster=True)
    block = block_of(100, 16)

    async def body(store: RedisStore) -> None:
        assert await store.put("item", block)
        assert await store.get("item") == block
        assert await store.get_rows("item", 40, 60) == block.rows(40, 60)
        assert await store.try_lease("other", "a", 5000)
        assert not await store.try_lease("other", "b", 5000)
        assert not await store.release_lease("other", "b")
        assert await store.release_lease("other", "a")
        assert await store.wait_for("item", timeout_s=1)
        assert not await store.wait_for("other", timeout_s=1)
        assert store.stats.num_errors == 0
        server.kill()
        assert await store.get("item") is None and store.stats.degraded

    try:
        server.start()
        with_store("fp", body, url=server.url, cluster=True, timeout_seconds=0.5)
    finally:
        server.kill()


def test_get_rows_sends_only_getrange_over_the_wire(private: PrivateRedis) -> None:
    """Server-side proof, independent of the store's own counters: no GET is issued and
    the bytes Redis sends are a small fraction of the value."""
    private.start()
    client = private.client()
    block = block_of(*LARGE)
    value_size = len(encode_entry(block))

    async def body(store: RedisStore) -> None:
        assert await store.put("big", block)
        client.config_resetstat()
        before = int(client.info("stats")["total_net_output_bytes"])
        for start, end in RANGES.values():
            assert await store.get_rows("big", start, end) == block.rows(start, end)
        sent = int(client.info("stats")["total_net_output_bytes"]) - before
        needed = sum(
            expected_bytes_read(block, start, end, cached_header=i > 0)
            for i, (start, end) in enumerate(RANGES.values())
        )
        # protocol framing and the first INFO reply are the only other bytes
        assert needed <= sent < needed + 4096
        assert sent < value_size // 5
        commands = client.info("commandstats")
        assert "cmdstat_get" not in commands
        assert commands["cmdstat_getrange"]["calls"] >= 2 * len(RANGES)

    try:
        with_store("fp", body, url=private.url)
    finally:
        client.close()


def call_everything(store: RedisStore, block: RowBlock) -> Callable[[], Awaitable[list[Any]]]:
    async def calls() -> list[Any]:
        return [
            await store.get("item"),
            await store.get_rows("item", 0, 2),
            await store.put("item", block),
            await store.try_lease("item", "me", 1000),
            await store.release_lease("item", "me"),
            await store.wait_for("item", timeout_s=1),
        ]

    return calls


def test_redis_down_then_back(private: PrivateRedis) -> None:
    """Backoff 0.4 s doubling to 0.8 s, on a clock the test moves."""
    private.start()
    block = block_of(16, 8)
    down = [None, None, False, False, False, False]
    clock = ManualClock()

    async def body(store: RedisStore) -> None:
        everything = call_everything(store, block)
        assert await store.put("item", block) and await store.get("item") == block
        private.kill()
        assert await everything() == down  # no exception out of any method
        assert store.stats.degraded and store.stats.num_errors == 1
        # during the backoff: misses at once, Redis untouched, no error per call
        for _ in range(50):
            assert await everything() == down
        clock.advance(0.39)
        assert await everything() == down
        assert store.stats.num_errors == 1
        # after it, exactly one call probes (and fails), even among concurrent ones
        clock.advance(0.02)
        assert await asyncio.gather(*(store.get("item") for _ in range(20))) == [None] * 20
        assert store.stats.num_errors == 2
        # the backoff doubled to 0.8 s: 0.79 s later calls still do not touch Redis
        clock.advance(0.79)
        assert await store.get("item") is None and store.stats.num_errors == 2
        private.start()
        clock.advance(0.02)
        # the next call probes and succeeds (the new server is empty)
        assert await store.get("item") is None
        assert not store.stats.degraded
        assert await store.put("item", block) and await store.get("item") == block
        assert store.stats.num_errors == 2

    with_store(
        "fp",
        body,
        url=private.url,
        backoff_start_seconds=0.4,
        backoff_max_seconds=0.8,
        clock=clock,
    )


def test_store_created_while_redis_is_down(private: PrivateRedis) -> None:
    block = block_of(16, 8)

    async def body(store: RedisStore) -> None:
        assert await store.get("item") is None
        assert store.stats.degraded and store.stats.num_errors == 1
        private.start()
        clock.advance(0.15)
        assert await store.put("item", block)
        assert not store.stats.degraded
        assert await store.get_rows("item", 3, 9) == block.rows(3, 9)

    clock = ManualClock()
    with_store("fp", body, url=private.url, backoff_start_seconds=0.1, clock=clock)


def test_paused_redis_times_out_instead_of_hanging(private: PrivateRedis) -> None:
    """A stopped server (SIGSTOP: it takes connections, answers nothing) until the test
    resumes it; only the store's own deadline (0.3 s) can end the call."""
    private.start()
    block = block_of(16, 8)
    clock = ManualClock()

    async def body(store: RedisStore) -> None:
        assert await store.put("item", block)
        private.process.send_signal(signal.SIGSTOP)
        try:
            assert await asyncio.wait_for(store.get("item"), 60) is None
            assert store.stats.degraded and store.stats.num_errors == 1
            assert await store.get_rows("item", 0, 4) is None  # backoff: Redis untouched
            assert store.stats.num_errors == 1
        finally:
            private.process.send_signal(signal.SIGCONT)
        # once it answers again, reads return the right value, not a late stale reply
        clock.advance(0.15)
        assert await store.get_rows("item", 0, 4) == block.rows(0, 4)
        assert await store.get("item") == block
        assert not store.stats.degraded

    with_store(
        "fp", body, url=private.url, timeout_seconds=0.3, backoff_start_seconds=0.1, clock=clock
    )


def test_only_the_holder_renews_its_lease(fingerprint: str, raw: redis.Redis) -> None:
    async def body(store: RedisStore) -> None:
        assert await store.try_lease("item", "a", 1000)
        assert 0 < raw.pttl(store.lease_key("item")) <= 1000
        assert not await store.renew_lease("item", "b", 60_000)
        assert raw.pttl(store.lease_key("item")) <= 1000
        assert await store.renew_lease("item", "a", 60_000)
        assert raw.pttl(store.lease_key("item")) > 1000
        assert await store.release_lease("item", "a")
        assert not await store.renew_lease("item", "a", 60_000), "a lease gone stays gone"

    with_store(fingerprint, body)


def test_a_computing_replica_keeps_its_short_lease_alive(fingerprint: str, raw: redis.Redis):
    """The compute lease is short (so a replica that dies frees the item at once) and
    renewed while the computation runs, however long that takes."""
    from encoder_service.encoder import EncoderCore
    from encoder_service.items import FleetSettings
    from encoder_service.memory_store import MemoryStore
    from tessera.media_decoder import MediaLimits
    from tests.unit.test_encoder_core import HeldFamily, item

    lease_ms = 3000  # renewed every second: only a stall of 2 s could lose it

    async def body(store: RedisStore) -> None:
        family = HeldFamily()
        fleet = FleetSettings("replica-a", lease_ms, 10.0)
        core = EncoderCore(family, MemoryStore(1 << 20), 8, 0.0, MediaLimits(10**6), store, fleet)
        wanted = item(7)
        encode = asyncio.create_task(core.encode([wanted], None))
        lease_key = store.lease_key(wanted.content_hash)
        while raw.get(lease_key) is None:
            await asyncio.sleep(0.01)
        assert raw.pttl(lease_key) <= lease_ms
        # Renewed while computing: its remaining time goes back up, again and again, past
        # the length of one lease (counted in renewals seen, not in seconds slept).
        num_renewals, last_ttl = 0, raw.pttl(lease_key)
        while num_renewals < 4:
            await asyncio.sleep(0.05)
            ttl = raw.pttl(lease_key)
            assert raw.get(lease_key) == b"replica-a", "renewed while computing"
            num_renewals += ttl > last_ttl
            last_ttl = ttl
        family.release.set()
        (result,) = await encode
        assert result.source.value == "computed"
        assert raw.exists(lease_key) == 0, "released when done"

    with_store(fingerprint, body)


def test_rows_from_redis_are_refused_for_a_range_of_another_length(fingerprint: str):
    """A replica that never computed the item reads its header from Redis: a range whose
    length differs from the item's is refused there too."""
    from encoder_service.encoder import EncoderCore
    from encoder_service.items import RowRequest
    from encoder_service.memory_store import MemoryStore
    from tessera.media_decoder import MediaLimits
    from tests.unit.test_encoder_core import HeldFamily, item

    async def body(store: RedisStore) -> None:
        family = HeldFamily()
        family.release.set()
        computing = EncoderCore(family, MemoryStore(1 << 20), 8, 0.0, MediaLimits(10**6), store)
        wanted = item(8)
        await computing.encode([wanted], None)  # 4 rows, now in Redis
        other = EncoderCore(family, MemoryStore(1 << 20), 8, 0.0, MediaLimits(10**6), store)
        right = RowRequest(wanted.content_hash, 0, 2, item_num_rows=4)
        assert (await other.resolve_slices([right], None))[0].num_rows == 2
        wrong = RowRequest(wanted.content_hash, 0, 2, item_num_rows=3)
        with pytest.raises(ValueError, match="has 4 rows; the request's range says 3"):
            await other.resolve_slices([wrong], None)

    with_store(fingerprint, body)
