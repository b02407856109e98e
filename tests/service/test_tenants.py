"""API keys and tenants: with keys, the gateway lets in only callers that send one (HTTP
401 and gRPC UNAUTHENTICATED otherwise); each key is a tenant whose encoder entries and
prefix blocks no other tenant shares, even for the same image and the same cache_salt.
Without keys, cache_salt alone keeps encoder entries apart."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import grpc
import httpx
import pytest

from tessera.client import Client, Message
from tessera.launcher import free_port
from tessera.media import decode_image
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc, gateway_pb2, gateway_pb2_grpc

KEYS = {"a": "key-of-tenant-a", "b": "key-of-tenant-b"}


def greedy_of(max_tokens: int) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=max_tokens)


@pytest.fixture(scope="module")
def stack(demo_model_dir, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "api-keys"
    key_file.write_text("# one key per line\n" + "\n".join(KEYS.values()) + "\n")
    own = Cluster()
    http_port, metrics_port = free_port(), free_port()
    gateway_args = ["--http-port", str(http_port), "--api-key-file", str(key_file)]
    gateway_args += ["--metrics-port", str(metrics_port)]
    try:
        own.start_stack(demo_model_dir, gateway_args=gateway_args)
        own.wait_ready()
        own.http = f"http://127.0.0.1:{http_port}"
        own.metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        yield own
    finally:
        own.stop()


def chat_body(image: bytes, **extra) -> dict:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Hm?"}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 3, **extra}


def post(stack: Cluster, body: dict, key: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{stack.http}/v1/chat/completions", json=body, headers=headers, timeout=60)


def generate(address: str, image: bytes, key: str | None = None, cache_salt: str = ""):
    """The gateway's gRPC Generate; returns (token ids, finished)."""
    request = gateway_pb2.GenerateRequest(
        messages=[
            gateway_pb2.ChatMessage(
                role="user",
                content=[gateway_pb2.ContentPart(image=image), gateway_pb2.ContentPart(text="Hm?")],
            )
        ],
        sampling=common_pb2.SamplingParams(max_tokens=3),
        cache_salt=cache_salt,
    )
    metadata = [("authorization", f"Bearer {key}")] if key is not None else []
    with grpc.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        responses = list(stub.Generate(request, timeout=60, metadata=metadata))
    tokens = [t for r in responses if r.HasField("delta") for t in r.delta.token_ids]
    return tokens, responses[-1].finished


def encoder_computed(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10).num_items_computed


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {KEYS['a']}"},  # the right key under another scheme
    ],
)
def test_http_without_a_valid_key_is_401(stack, headers):
    body = chat_body(noise_image(1, 24, 24))
    for answer in (
        httpx.post(f"{stack.http}/v1/chat/completions", json=body, headers=headers, timeout=60),
        httpx.get(f"{stack.http}/v1/models", headers=headers, timeout=10),
    ):
        assert answer.status_code == 401, answer.text
        error = answer.json()["error"]
        assert error["code"] == "invalid_api_key" and "API key" in error["message"]


def test_open_routes_and_metrics_off_the_public_port(stack):
    assert httpx.get(f"{stack.http}/health", timeout=10).status_code == 200
    assert httpx.get(f"{stack.http}/metrics", timeout=10).status_code == 404
    scraped = httpx.get(stack.metrics, timeout=10)
    assert scraped.status_code == 200 and "tessera_gateway" in scraped.text
    models = httpx.get(
        f"{stack.http}/v1/models", headers={"Authorization": f"Bearer {KEYS['a']}"}, timeout=10
    )
    assert models.status_code == 200


def test_grpc_without_a_valid_key_is_unauthenticated(stack):
    for key in (None, "not-a-key"):
        with pytest.raises(grpc.RpcError) as caught:
            generate(stack.address("gateway"), noise_image(2, 24, 24), key)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    tokens, finished = generate(stack.address("gateway"), noise_image(2, 24, 24), KEYS["a"])
    assert len(tokens) == 3 and finished.usage.completion_tokens == 3


def test_tenants_share_neither_encoder_entries_nor_prefix_blocks(stack):
    image = noise_image(3, 28, 28)
    gateway = stack.address("gateway")
    before = encoder_computed(stack.address("encoder"))
    a_first, _ = generate(gateway, image, KEYS["a"], cache_salt="same")
    a_again, a_repeat = generate(gateway, image, KEYS["a"], cache_salt="same")
    b_first, b_done = generate(gateway, image, KEYS["b"], cache_salt="same")
    assert a_first == a_again == b_first  # the same answer for everyone
    # A's repeat reuses A's entry and prefix; B, naming the same salt, gets neither.
    assert encoder_computed(stack.address("encoder")) - before == 2
    assert a_repeat.stats.num_items_computed == 0
    assert a_repeat.stats.decoder.num_cached_prompt_tokens > 0
    assert b_done.stats.decoder.num_cached_prompt_tokens == 0
    assert b_done.stats.num_items_computed + b_done.stats.num_items_cached == 1


def test_http_requests_of_two_tenants_are_apart(stack):
    image = noise_image(4, 30, 30)
    before = encoder_computed(stack.address("encoder"))
    answers = [post(stack, chat_body(image), KEYS[tenant]) for tenant in ("a", "a", "b")]
    assert [a.status_code for a in answers] == [200, 200, 200]
    texts = {a.json()["choices"][0]["message"]["content"] for a in answers}
    assert len(texts) == 1
    assert encoder_computed(stack.address("encoder")) - before == 2


def test_without_keys_cache_salt_keeps_encoder_entries_apart(cluster):
    """The session gateway has no keys: two salts are two entries, and the item cannot
    be read from the encoder under its unsalted hash."""
    image = noise_image(5, 26, 26)
    before = encoder_computed(cluster.address("encoder"))
    first, _ = generate(cluster.address("gateway"), image, cache_salt="tenant-1")
    second, _ = generate(cluster.address("gateway"), image, cache_salt="tenant-2")
    assert first == second
    assert encoder_computed(cluster.address("encoder")) - before == 2
    unsalted = decode_image(image).content_hash(cluster.fingerprint())
    with grpc.insecure_channel(cluster.address("encoder")) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        request = encoder_pb2.GetEmbeddingSlicesRequest(
            slices=[encoder_pb2.RowSlice(content_hash=unsalted, start=0, end=1)]
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.GetEmbeddingSlices(request, timeout=30))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_python_client_and_the_cli_send_the_key(stack):
    image = noise_image(6, 24, 24)
    with Client(stack.address("gateway"), api_key=KEYS["b"], max_retries=0) as client:
        done = client.complete([Message("user", [image, "Hm?"])], greedy_of(3))
    assert len(done.token_ids) == 3
    command = [sys.executable, "-m", "tessera.cli", "generate", "--server"]
    command += [stack.address("gateway"), "--max-tokens", "2", "--json", "hi"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "API key" in refused.stderr
    env = {**os.environ, "TESSERA_API_KEY": KEYS["a"]}
    sent = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert sent.returncode == 0, sent.stderr
    assert len(json.loads(sent.stdout)["token_ids"]) == 2
