"""Issue 13 against a real, locked-down redis-server started here: a password for the
default user, an ACL user for the encoders, TLS only, client certificates checked.

An encoder (a real process) caches through it as the ACL user; wrong credentials or
certificates degrade to serving without Redis, with the reason in the log; an entry
forged with valid unkeyed checksums but no valid MAC, or one whose header states another
row shape than the model's, is counted, deleted and recomputed, never served.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import pytest

from encoder_service.entry_mac import EntryMac
from encoder_service.redis_connection import RedisConnection
from encoder_service.redis_format import encode_entry
from encoder_service.redis_store import RedisStore, RedisStoreStats
from tessera.media import decode_image
from tessera.tensor_codec import RowBlock, itemsize
from tessera.testbed.cluster import Cluster
from tessera.testbed.redis_server import PrivateRedis, RedisSecurity
from tessera.testbed.reference import noise_image
from tessera.testbed.tls_files import TlsFiles, make_tls_files
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

ADMIN_PASSWORD = f"admin-{uuid.uuid4().hex}"
PASSWORD = f"tessera-{uuid.uuid4().hex}"
WRONG_PASSWORD = f"wrong-{uuid.uuid4().hex}"
# The encoders' user: their own keys only, and no admin or dangerous commands.
ACL_USER = f"tessera on >{PASSWORD} ~tessera:* resetchannels +@all -@dangerous"


@dataclass(frozen=True)
class Secrets:
    password_file: Path
    wrong_password_file: Path
    mac_key_file: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Secrets:
    directory = tmp_path_factory.mktemp("secrets")
    files = Secrets(directory / "password", directory / "wrong", directory / "mac-key")
    files.password_file.write_text(PASSWORD + "\n")
    files.wrong_password_file.write_text(WRONG_PASSWORD + "\n")
    files.mac_key_file.write_text(uuid.uuid4().hex + uuid.uuid4().hex + "\n")
    return files


def locked_down(directory: Path, tls: TlsFiles, cluster: bool = False) -> PrivateRedis:
    return PrivateRedis(directory, cluster, RedisSecurity(ADMIN_PASSWORD, (ACL_USER,), tls))


@pytest.fixture(scope="module")
def secure_redis(tmp_path_factory: pytest.TempPathFactory, tls: TlsFiles) -> Iterator[PrivateRedis]:
    server = locked_down(tmp_path_factory.mktemp("redis"), tls)
    try:
        server.start()
        yield server
    finally:
        server.kill()


def connection(server: PrivateRedis, tls: TlsFiles) -> RedisConnection:
    """What an encoder of the fleet uses: the ACL user, its password, the CA, a client
    certificate."""
    files = (str(tls.ca), str(tls.client_cert), str(tls.client_key))
    return RedisConnection(server.url, server.cluster, "tessera", PASSWORD, *files)


async def store_calls(store: RedisStore, block: RowBlock) -> list[object]:
    return [
        await store.put("item", block),
        await store.get("item"),
        await store.get_rows("item", 3, 9),
        await store.try_lease("other", "me", 5000),
        await store.release_lease("other", "me"),
    ]


def in_a_store(
    conn: RedisConnection, block: RowBlock, check: Callable[[], None] | None = None
) -> tuple[list[object], RedisStoreStats]:
    """Every kind of store call once, then `check()` while the store is connected."""

    async def go() -> tuple[list[object], RedisStoreStats]:
        store = RedisStore(conn, "fp", 60, 5.0, 4, backoff_start_seconds=60)
        try:
            results = await store_calls(store, block)
            if check is not None:
                check()
            return results, store.stats
        finally:
            await store.close()

    return asyncio.run(go())


BLOCK = RowBlock("float32", 20, 4, bytes(range(256)) + bytes(64))


# -- the store against the locked-down server ------------------------------------------------


@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
def test_the_store_works_over_tls_as_the_acl_user(
    tmp_path: Path, tls: TlsFiles, cluster: bool
) -> None:
    server = locked_down(tmp_path, tls, cluster)
    try:
        server.start()
        admin = server.client()

        def connected_as_tessera() -> None:
            clients = admin.execute_command("CLIENT", "LIST").decode()
            assert " user=tessera " in clients, clients

        results, stats = in_a_store(connection(server, tls), BLOCK, connected_as_tessera)
        assert results == [True, BLOCK, BLOCK.rows(3, 9), True, True]
        assert stats.num_errors == 0 and not stats.degraded
        assert admin.keys("tessera:emb:v2:*"), "written through the locked-down server"
        admin.close()
    finally:
        server.kill()


CREDENTIALS = ("Redis refused the credentials",)
# With TLS 1.3 the server checks the client's certificate after the client's side of the
# handshake is done, then sends an alert and closes: the client reads either the alert
# or, when the close wins the race, a reset connection. Either way Redis is unavailable.
CERTIFICATE = ("the TLS handshake failed", "Connection reset by peer", "Connection closed")

Wrong = Callable[[RedisConnection, TlsFiles], RedisConnection]
# case -> (what the encoder gets wrong, what the log may say about it)
REFUSALS: dict[str, tuple[Wrong, tuple[str, ...]]] = {
    "wrong password": (lambda good, _: replace(good, password=WRONG_PASSWORD), CREDENTIALS),
    "unknown user": (lambda good, _: replace(good, username="mallory"), CREDENTIALS),
    "no password": (lambda good, _: replace(good, username=None, password=None), CREDENTIALS),
    "no client certificate": (
        lambda good, _: replace(good, tls_cert_file=None, tls_key_file=None),
        CERTIFICATE,
    ),
    "client certificate of another CA": (
        lambda good, tls: replace(
            good, tls_cert_file=str(tls.stranger_cert), tls_key_file=str(tls.stranger_key)
        ),
        CERTIFICATE,
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_credentials_degrade_with_the_reason(
    secure_redis: PrivateRedis, tls: TlsFiles, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refusing us is Redis being unavailable (the encoder serves without it and
    keeps probing), with a log line that says what to check."""
    wrong, reasons = REFUSALS[case]
    with caplog.at_level(logging.WARNING):
        results, stats = in_a_store(wrong(connection(secure_redis, tls), tls), BLOCK)
    assert results == [False, None, None, False, False]
    assert stats.degraded and stats.num_errors == 1
    assert any(reason in caplog.text for reason in reasons), caplog.text
    assert PASSWORD not in caplog.text and WRONG_PASSWORD not in caplog.text


# -- encoders: real processes ------------------------------------------------------------------


def redis_flags(server: PrivateRedis, tls: TlsFiles, password_file: Path) -> list[str]:
    return [
        "--redis-url",
        server.url,
        "--redis-username",
        "tessera",
        "--redis-password-file",
        str(password_file),
        "--redis-tls-ca-file",
        str(tls.ca),
        "--redis-tls-cert-file",
        str(tls.client_cert),
        "--redis-tls-key-file",
        str(tls.client_key),
        # A loaded machine must not make a TLS call look like Redis being down.
        "--redis-timeout-seconds",
        "5",
    ]


@pytest.fixture(scope="module")
def encoders(demo_model_dir, secure_redis, tls, secrets) -> Iterator[Cluster]:
    """`secure`: the right password and the fleet's MAC key, and a memory cache that
    keeps nothing, so every read after the first Encode goes to Redis. `refused`: a wrong
    password and no MAC key."""
    own = Cluster(cold=True)  # a process of its own: a test reads its command line
    model = ["--model", str(demo_model_dir)]
    try:
        own.start(
            "secure",
            "encoder",
            [
                *model,
                *redis_flags(secure_redis, tls, secrets.password_file),
                "--cache-mac-key-file",
                str(secrets.mac_key_file),
                "--cache-bytes",
                "0",
            ],
        )
        own.start(
            "refused",
            "encoder",
            [*model, *redis_flags(secure_redis, tls, secrets.wrong_password_file)],
        )
        own.wait_ready()
        yield own
    finally:
        own.stop()


def stub(cluster: Cluster, name: str) -> encoder_pb2_grpc.EncoderServiceStub:
    return encoder_pb2_grpc.EncoderServiceStub(grpc.insecure_channel(cluster.address(name)))


def stats(cluster: Cluster, name: str) -> encoder_pb2.EncoderStats:
    return stub(cluster, name).GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def media_item(cluster: Cluster, name: str, seed: int) -> common_pb2.MediaItem:
    image = noise_image(seed, 40, 40)
    return common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=image,
        content_hash=decode_image(image).content_hash(cluster.fingerprint(name)),
    )


def encode(cluster: Cluster, name: str, item: common_pb2.MediaItem) -> encoder_pb2.EncodedItem:
    request = encoder_pb2.EncodeRequest(items=[item])
    (encoded,) = stub(cluster, name).Encode(request, timeout=60).items
    return encoded


def rows_of(cluster: Cluster, name: str, encoded: encoder_pb2.EncodedItem) -> bytes:
    request = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[
            encoder_pb2.RowSlice(
                content_hash=encoded.content_hash,
                start=0,
                end=encoded.num_rows,
                item_num_rows=encoded.num_rows,
            )
        ]
    )
    messages = stub(cluster, name).GetEmbeddingSlices(request, timeout=30)
    return b"".join(m.rows.data for m in messages)


def entry_key(server: PrivateRedis, content_hash: str) -> bytes:
    with server.client() as admin:
        (key,) = admin.keys(f"tessera:emb:v2:*:{content_hash}")
    return key


def store_value(server: PrivateRedis, key: bytes, value: bytes) -> None:
    with server.client() as admin:
        admin.set(key, value, px=60_000)


def computed_and_cached(cluster: Cluster, server: PrivateRedis, seed: int):
    """An item encoded by `secure`, its honest rows (read back from Redis) and its key."""
    item = media_item(cluster, "secure", seed)
    encoded = encode(cluster, "secure", item)
    assert encoded.source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    return item, encoded, rows_of(cluster, "secure", encoded), entry_key(server, item.content_hash)


def test_an_encoder_caches_through_tls_as_the_acl_user(encoders, secure_redis, secrets):
    before = stats(encoders, "secure")
    item, _, honest, key = computed_and_cached(encoders, secure_redis, seed=1301)
    # The memory cache keeps nothing: the second Encode is served from Redis.
    again = encode(encoders, "secure", item)
    assert again.source == encoder_pb2.ENCODE_SOURCE_REDIS
    assert rows_of(encoders, "secure", again) == honest
    after = stats(encoders, "secure")
    assert after.num_items_computed - before.num_items_computed == 1
    assert after.num_redis_hits - before.num_redis_hits == 3  # Encode and two slice reads
    assert after.num_redis_errors == 0 and not after.degraded and after.redis_enabled
    assert after.num_corrupt_entries == before.num_corrupt_entries
    mac = EntryMac.from_file(secrets.mac_key_file)
    assert key.decode().startswith(f"tessera:emb:v2:{mac.key_id}:")
    log = encoders.log_text("secure")
    start_line = f"redis={secure_redis.url} user=tessera password=set tls=client-cert"
    assert f"{start_line} redis_entries=mac:{mac.key_id}" in log
    assert "unkeyed checksums" not in log
    process = encoders.child("secure").process
    argv = Path(f"/proc/{process.pid}/cmdline").read_bytes()
    for secret in (PASSWORD.encode(), secrets.mac_key_file.read_bytes().strip()):
        assert secret not in argv and secret.decode() not in log


def forged_rows(encoded: encoder_pb2.EncodedItem) -> RowBlock:
    """Rows of the right shape that the model never produced."""
    size = encoded.num_rows * encoded.hidden_size * itemsize(encoded.dtype)
    data = bytes([0x3F]) * size
    return RowBlock(encoded.dtype, encoded.num_rows, encoded.hidden_size, data)


def test_a_forged_entry_with_valid_checksums_is_recomputed_never_served(encoders, secure_redis):
    """The issue's probe: someone who can write to Redis (but has no MAC key) replaces
    an entry with rows of their choosing and correct unkeyed checksums."""
    item, encoded, honest, key = computed_and_cached(encoders, secure_redis, seed=1302)
    forged = encode_entry(forged_rows(encoded), binding=key)  # valid unkeyed checksums
    before = stats(encoders, "secure")

    store_value(secure_redis, key, forged)
    again = encode(encoders, "secure", item)
    assert again.source == encoder_pb2.ENCODE_SOURCE_COMPUTED, "recomputed, not served"
    assert rows_of(encoders, "secure", again) == honest  # the honest entry, put back
    after = stats(encoders, "secure")
    assert after.num_corrupt_entries - before.num_corrupt_entries == 1
    assert after.num_items_computed - before.num_items_computed == 1

    # A slice read (GETRANGE of the header and the groups it needs) refuses it too.
    store_value(secure_redis, key, forged)
    with pytest.raises(grpc.RpcError) as caught:
        rows_of(encoders, "secure", encoded)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert stats(encoders, "secure").num_corrupt_entries - after.num_corrupt_entries == 1
    with secure_redis.client() as admin:
        assert not admin.exists(key), "deleted, so the next Encode recomputes it"
    assert "header MAC mismatch" in encoders.log_text("secure")


@pytest.mark.parametrize("shape", ["wider rows", "float16 of the same row bytes"])
def test_an_entry_of_another_row_shape_is_recomputed(encoders, secure_redis, secrets, shape):
    """Even with a valid MAC (an encoder holding the key but misconfigured), a header
    whose width or dtype is not the model's is refused the same way."""
    seed = 1303 if shape == "wider rows" else 1304
    item, encoded, honest, key = computed_and_cached(encoders, secure_redis, seed)
    assert encoded.dtype == "float32"
    rows, width = encoded.num_rows, encoded.hidden_size
    if shape == "wider rows":
        block = RowBlock("float32", rows, width + 8, bytes(rows * (width + 8) * 4))
    else:
        block = RowBlock("float16", rows, width * 2, bytes(rows * width * 4))
    mac = EntryMac.from_file(secrets.mac_key_file)
    store_value(secure_redis, key, encode_entry(block, binding=key, mac=mac))
    before = stats(encoders, "secure")
    again = encode(encoders, "secure", item)
    assert again.source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    assert (again.hidden_size, again.dtype) == (width, "float32")
    assert rows_of(encoders, "secure", again) == honest
    after = stats(encoders, "secure")
    assert after.num_corrupt_entries - before.num_corrupt_entries == 1
    assert after.num_items_computed - before.num_items_computed == 1
    assert "the model's are" in encoders.log_text("secure")


def test_an_encoder_with_a_wrong_password_serves_without_redis(encoders):
    item = media_item(encoders, "refused", 1305)
    encoded = encode(encoders, "refused", item)
    assert encoded.source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    assert len(rows_of(encoders, "refused", encoded)) == encoded.num_rows * encoded.hidden_size * 4
    refused = stats(encoders, "refused")
    assert refused.redis_enabled and refused.degraded and refused.num_redis_errors >= 1
    log = encoders.log_text("refused")
    assert "Redis refused the credentials" in log
    assert "unkeyed checksums" in log, "no MAC key: the start says entries are not authenticated"
    assert "redis_entries=unauthenticated" in log
    assert WRONG_PASSWORD not in log and PASSWORD not in log


def test_an_unreadable_password_file_stops_the_encoder_at_start(demo_model_dir, tmp_path):
    missing = tmp_path / "no-such-file"
    command = [sys.executable, "-m", "tessera.cli", "encoder", "--model", str(demo_model_dir)]
    command += ["--port", "0", "--redis-url", "redis://127.0.0.1:6379/0"]
    command += ["--redis-password-file", str(missing)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"cannot read the Redis password file {missing}" in result.stderr
