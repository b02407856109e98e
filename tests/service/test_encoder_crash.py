"""An encoder killed while computing an item: its compute lease in Redis dies with it
within one short lease length (2 s), so another replica computes the item instead of
waiting out --remote-wait-seconds (set here far above the call's deadline)."""

from __future__ import annotations

import io

import grpc
import pytest
import redis
from PIL import Image

from encoder_service.redis_store import LEASE_PREFIX
from tessera.media import decode_image
from tessera.testbed.cluster import Cluster
from tessera.testbed.redis_server import PrivateRedis
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

# A 30 s compute lease (as before) or the whole remote wait would miss this deadline;
# the 2 s lease, renewed only while its holder lives, is far inside it.
DEADLINE_SECONDS = 20


@pytest.fixture(scope="module")
def pair(demo_model_dir, tmp_path_factory):
    redis_server = PrivateRedis(tmp_path_factory.mktemp("redis"))
    redis_server.start()
    own = Cluster()
    flags = ["--model", str(demo_model_dir), "--redis-url", redis_server.url]
    # A slow item (a 60 M-pixel image) must be allowed; the wait for another replica's
    # computation must not be what ends it.
    flags += ["--max-request-pixels", str(10**9), "--remote-wait-seconds", "600"]
    try:
        for name in ("doomed", "survivor"):
            own.start(name, "encoder", flags)
        own.wait_ready()
        own.redis = redis_server
        yield own
    finally:
        own.stop()
        redis_server.kill()


def slow_item(fingerprint: str) -> common_pb2.MediaItem:
    buffer = io.BytesIO()
    Image.new("L", (7700, 7700), 90).save(buffer, format="PNG")
    data = buffer.getvalue()
    return common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=data,
        content_hash=decode_image(data).content_hash(fingerprint),
    )


def encoder_stub(pair: Cluster, name: str) -> encoder_pb2_grpc.EncoderServiceStub:
    return encoder_pb2_grpc.EncoderServiceStub(grpc.insecure_channel(pair.address(name)))


def test_a_killed_replicas_item_is_computed_by_another(pair):
    fingerprint = pair.fingerprint("doomed")
    item = slow_item(fingerprint)
    raw = redis.Redis.from_url(pair.redis.url)
    lease_key = f"{LEASE_PREFIX}:{fingerprint}:{item.content_hash}"
    doomed = encoder_stub(pair, "doomed")
    call = doomed.Encode.future(encoder_pb2.EncodeRequest(items=[item]), timeout=120)
    while not raw.exists(lease_key):  # the doomed replica holds the compute lease
        assert not call.done(), "the item was computed before the replica could be killed"
    pair.kill("doomed")
    assert raw.exists(lease_key), "the lease outlives its holder for a moment"

    survivor = encoder_stub(pair, "survivor")
    request = encoder_pb2.EncodeRequest(items=[item])
    encoded = survivor.Encode(request, timeout=DEADLINE_SECONDS).items[0]
    assert encoded.source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    assert encoded.num_rows > 0
    stats = survivor.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
    assert stats.num_remote_waits == 1  # it waited for the dead replica, then computed
