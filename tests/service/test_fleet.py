"""The encoder fleet: replicas sharing a Redis cache compute each item once, serve what
another computed, and keep every request correct when Redis or a replica fails."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from tessera.client import Client, Message
from tessera.media import decode_image
from tessera.testbed.cluster import Cluster
from tessera.testbed.redis_server import PrivateRedis
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

ENCODERS = ("enc-a", "enc-b", "enc-c")
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def fleet(demo_model_dir, tmp_path_factory):
    redis_server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    redis_server.start()
    own = Cluster()
    model = ["--model", str(demo_model_dir)]
    # Generous Redis and lease deadlines: single-flight across replicas holds while Redis
    # answers and the computing replica renews its lease, and a loaded CI machine can
    # stall either past a short deadline (a replica then computes too, correctly, and the
    # compute-once test would count two). Kill and pause tests do not wait on them: a
    # killed Redis refuses at once, a 2 s pause ends inside the deadline.
    redis = [
        "--redis-url",
        redis_server.url,
        "--redis-timeout-seconds",
        "10",
        "--compute-lease-ms",
        "10000",
        "--remote-wait-seconds",
        "30",
    ]
    try:
        encoders = [own.start(name, "encoder", [*model, *redis]) for name in ENCODERS]
        decoder = own.start("decoder", "decoder", [*model, "--encoders", ",".join(encoders)])
        own.start(
            "gateway",
            "gateway",
            [
                *model,
                "--encoders",
                ",".join(encoders),
                "--decoders",
                decoder,
                "--replica-retry-seconds",
                "30",
            ],
        )
        own.wait_ready()
        own.redis = redis_server
        yield own
    finally:
        own.stop()
        redis_server.kill()


def media_item(cluster: Cluster, image: bytes) -> common_pb2.MediaItem:
    return common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=image,
        content_hash=decode_image(image).content_hash(cluster.fingerprint()),
    )


def stub(cluster: Cluster, name: str) -> encoder_pb2_grpc.EncoderServiceStub:
    return encoder_pb2_grpc.EncoderServiceStub(grpc.insecure_channel(cluster.address(name)))


def stats(cluster: Cluster, name: str) -> encoder_pb2.EncoderStats:
    return stub(cluster, name).GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def rows_of(cluster: Cluster, name: str, content_hash: str, start: int, end: int) -> bytes:
    request = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=start, end=end)]
    )
    messages = stub(cluster, name).GetEmbeddingSlices(request, timeout=10)
    return b"".join(m.rows.data for m in messages)


def total_computed(cluster: Cluster) -> int:
    return sum(stats(cluster, name).num_items_computed for name in ENCODERS)


def test_a_replica_serves_what_another_computed(fleet):
    item = media_item(fleet, noise_image(701, 50, 40))
    request = encoder_pb2.EncodeRequest(items=[item])
    assert (
        stub(fleet, "enc-a").Encode(request).items[0].source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    )
    computed_b = stats(fleet, "enc-b").num_items_computed

    assert stub(fleet, "enc-b").Encode(request).items[0].source == encoder_pb2.ENCODE_SOURCE_REDIS
    assert stats(fleet, "enc-b").num_items_computed == computed_b
    # enc-c never saw it: its slices come from Redis, row ranges at the start, middle, end.
    for start, end in [(0, 3), (5, 11), (12, 16), (0, 16)]:
        assert rows_of(fleet, "enc-c", item.content_hash, start, end) == rows_of(
            fleet, "enc-a", item.content_hash, start, end
        )
    assert stats(fleet, "enc-c").num_items_computed == 0


def test_concurrent_first_requests_across_replicas_compute_once(fleet):
    item = media_item(fleet, noise_image(702, 60, 30))
    before = total_computed(fleet)

    async def twenty_requests() -> list[int]:
        channels = [grpc.aio.insecure_channel(fleet.address(n)) for n in ENCODERS]
        try:
            calls = [
                encoder_pb2_grpc.EncoderServiceStub(channels[i % 3]).Encode(
                    encoder_pb2.EncodeRequest(items=[item])
                )
                for i in range(20)
            ]
            return [r.items[0].source for r in await asyncio.gather(*calls)]
        finally:
            for channel in channels:
                await channel.close()

    sources = asyncio.run(twenty_requests())
    assert total_computed(fleet) - before == 1
    assert sources.count(encoder_pb2.ENCODE_SOURCE_COMPUTED) == 1


def test_a_corrupt_entry_is_recomputed_never_served(fleet):
    item = media_item(fleet, noise_image(703, 40, 40))
    request = encoder_pb2.EncodeRequest(items=[item])
    stub(fleet, "enc-a").Encode(request)
    good = rows_of(fleet, "enc-a", item.content_hash, 0, 16)
    with fleet.redis.client() as raw:
        (key,) = raw.keys(f"tessera:emb:v2:*:{item.content_hash}")
        value = bytearray(raw.get(key))
        value[-5] ^= 0xFF  # a flipped byte in the rows (one group of 16 here)
        raw.set(key, bytes(value), px=60_000)
    corrupt_before = stats(fleet, "enc-b").num_corrupt_entries

    # enc-b reads the rows from Redis: a miss (NOT_FOUND), the entry deleted, never the
    # bad bytes; the decoder would now send the item to be encoded again.
    with pytest.raises(grpc.RpcError) as caught:
        rows_of(fleet, "enc-b", item.content_hash, 4, 8)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert stats(fleet, "enc-b").num_corrupt_entries == corrupt_before + 1
    with fleet.redis.client() as raw:
        assert not raw.exists(key)
    response = stub(fleet, "enc-b").Encode(request)
    assert response.items[0].source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    assert rows_of(fleet, "enc-b", item.content_hash, 0, 16) == good


def chat(seed: int) -> list[tuple[str, list[str | bytes]]]:
    return [("user", [noise_image(seed, 30 + seed % 20, 40), "What is this?"])]


def run_load(fleet, reference, seeds: list[int], during=None) -> None:
    """Requests through the gateway from 3 threads; `during()` runs mid-load. Every
    answer must equal generate()."""
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    started = threading.Event()

    def worker(part: list[int]) -> None:
        try:
            with Client(fleet.address("gateway"), timeout_seconds=60) as client:
                for seed in part:
                    started.set()
                    messages = [Message(r, p) for r, p in chat(seed)]
                    sampling = common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)
                    results[seed] = client.complete(messages, sampling, 4).token_ids
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seeds[i::3],)) for i in range(3)]
    for thread in threads:
        thread.start()
    if during is not None:
        started.wait(30)
        time.sleep(0.2)
        during()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    for seed in seeds:
        assert_greedy_match(results[seed], reference.generate(chat(seed), MAX_NEW_TOKENS))


def test_redis_killed_mid_load_then_back(fleet, reference):
    run_load(fleet, reference, list(range(800, 812)), during=fleet.redis.kill)
    # The load may have ended before the kill; an item new to each replica makes every
    # one of them go to Redis now, so what follows does not depend on when it died.
    for index, name in enumerate(ENCODERS):
        item = media_item(fleet, noise_image(820 + index, 31, 33))
        stub(fleet, name).Encode(encoder_pb2.EncodeRequest(items=[item]), timeout=60)
    assert all(stats(fleet, name).degraded for name in ENCODERS)
    fleet.redis.start()
    # Replicas probe within their backoff (at most 5 s); the deadline is only a bound.
    deadline = time.monotonic() + 60
    while any(stats(fleet, name).degraded for name in ENCODERS) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not any(stats(fleet, name).degraded for name in ENCODERS)
    # Back in use: one replica computes, another reads it from Redis.
    item = media_item(fleet, noise_image(831, 33, 33))
    stub(fleet, "enc-a").Encode(encoder_pb2.EncodeRequest(items=[item]))
    source = stub(fleet, "enc-c").Encode(encoder_pb2.EncodeRequest(items=[item])).items[0].source
    assert source == encoder_pb2.ENCODE_SOURCE_REDIS


def test_redis_paused_mid_load(fleet, reference):
    def pause() -> None:
        with fleet.redis.client() as raw:
            raw.execute_command("CLIENT", "PAUSE", 2000)

    run_load(fleet, reference, list(range(840, 849)), during=pause)


def test_redis_down_at_start(demo_model_dir, reference, tmp_path):
    """An encoder whose Redis is not there starts ready, degraded, and serves."""
    nowhere = PrivateRedis(tmp_path)  # a free port with no server behind it
    own = Cluster()
    model = ["--model", str(demo_model_dir)]
    try:
        encoder = own.start("encoder", "encoder", [*model, "--redis-url", nowhere.url])
        decoder = own.start("decoder", "decoder", [*model, "--encoders", encoder])
        own.start("gateway", "gateway", [*model, "--encoders", encoder, "--decoders", decoder])
        own.wait_ready()
        with Client(own.address("gateway")) as client:
            done = client.complete(
                [Message(r, p) for r, p in chat(850)],
                common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS),
            )
        assert_greedy_match(done.token_ids, reference.generate(chat(850), MAX_NEW_TOKENS))
        encoder_stats = stats(own, "encoder")
        assert encoder_stats.redis_enabled and encoder_stats.degraded
    finally:
        own.stop()


def test_an_encoder_killed_mid_load(fleet, reference):
    """Runs last in this module: it leaves the fleet one replica short."""
    run_load(fleet, reference, list(range(900, 915)), during=fleet.child("enc-b").process.kill)
