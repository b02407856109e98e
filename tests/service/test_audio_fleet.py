"""Audio across an encoder fleet: two replicas sharing a Redis cache encode each clip once
for the whole fleet, whichever replica and client asked, serve its rows to the other
replica from Redis, and the decoder receives exactly the rows its chunks overlap."""

from __future__ import annotations

import threading

import grpc
import pytest

from tessera.audio import decode_audio
from tessera.client import Client, Message
from tessera.demo_models import make_demo_model
from tessera.testbed.audio_files import wav_clip
from tessera.testbed.cluster import Cluster
from tessera.testbed.redis_server import PrivateRedis
from tessera.testbed.reference import Reference, assert_greedy_match
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

ENCODERS = ("enc-a", "enc-b")
MAX_NEW_TOKENS = 6
CLIP_A, CLIP_B = wav_clip(31, 2.0, rate=44_100, channels=2), wav_clip(32, 1.3)
PROMPT = [("user", [CLIP_A, "first, then", CLIP_B, "which is louder?"])]
NUM_CLIENTS = 4


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    model_dir = make_demo_model(tmp_path_factory.mktemp("qwen2-audio") / "tiny", "qwen2-audio")
    redis_server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    redis_server.start()
    own = Cluster()
    model = ["--model", str(model_dir)]
    try:
        redis = ["--redis-url", redis_server.url]
        encoders = [own.start(name, "encoder", [*model, *redis]) for name in ENCODERS]
        # Without prefix caching every client's prefill fetches the clips' rows: what
        # is shared is the encoders' work only (a cache_salt per client would now keep
        # the encoder entries apart too).
        decoder = own.start(
            "decoder",
            "decoder",
            [*model, "--encoders", ",".join(encoders), "--no-enable-prefix-caching"],
        )
        own.start(
            "gateway", "gateway", [*model, "--encoders", ",".join(encoders), "--decoders", decoder]
        )
        own.reference = Reference(model_dir)
        own.wait_ready()
        yield own
    finally:
        own.stop()
        redis_server.kill()


def stub(fleet: Cluster, name: str) -> encoder_pb2_grpc.EncoderServiceStub:
    return encoder_pb2_grpc.EncoderServiceStub(grpc.insecure_channel(fleet.address(name)))


def computed(fleet: Cluster, name: str) -> int:
    request = encoder_pb2.GetEncoderStatsRequest()
    return stub(fleet, name).GetStats(request, timeout=10).num_items_computed


def test_concurrent_clients_get_one_encode_per_clip_fleet_wide(fleet):
    expected = fleet.reference.generate(PROMPT, MAX_NEW_TOKENS)
    results: list = []
    errors: list[BaseException] = []
    start = threading.Barrier(NUM_CLIENTS)

    def send() -> None:
        try:
            with Client(fleet.address("gateway")) as client:
                start.wait(30)
                message = [Message(role, parts) for role, parts in PROMPT]
                sampling = common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)
                results.append(client.complete(message, sampling, 16))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=send) for _ in range(NUM_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    assert len(results) == NUM_CLIENTS
    placeholder = fleet.reference.placeholder_token_id
    for done in results:
        assert done.prompt_token_ids == expected.prompt_token_ids
        assert_greedy_match(done.token_ids, expected, "audio fleet")
        # Bytes received / minimum = 1.00: one row per audio position, no more.
        num_rows = expected.prompt_token_ids.count(placeholder)
        assert done.stats.num_embedding_bytes == num_rows * fleet.reference.row_bytes
    assert sum(computed(fleet, name) for name in ENCODERS) == 2, "one pass per clip"


def test_the_other_replica_serves_a_clip_from_redis(fleet):
    fingerprint = fleet.fingerprint()
    clip = wav_clip(33, 0.8)
    rate = fleet.reference.processor.feature_extractor.sampling_rate
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_AUDIO,
        data=clip.data,
        content_hash=decode_audio(clip.data, rate, 30).content_hash(fingerprint),
    )
    request = encoder_pb2.EncodeRequest(items=[item])
    first = stub(fleet, "enc-a").Encode(request, timeout=60).items[0]
    assert first.source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    before = computed(fleet, "enc-b")
    second = stub(fleet, "enc-b").Encode(request, timeout=60).items[0]
    assert second.source == encoder_pb2.ENCODE_SOURCE_REDIS
    assert computed(fleet, "enc-b") == before
    assert second.num_rows == first.num_rows == 20  # 0.8 s: 80 frames -> 40 -> 20 rows
