"""Metrics, the access log, the stats line and JSON logs, on a real gateway (JSON logs,
HTTP API) in front of the session's encoder and decoder."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import uuid
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.metrics import FinishedRequest, GatewayMetrics
from gateway.pipeline import ItemSources
from gateway.stats_log import StatsLogger, decoders_stats
from tessera.client import Client, Message
from tessera.testbed.cluster import http_gateway, scrape_metrics
from tessera.testbed.reference import noise_image
from tessera.v1 import gateway_pb2, gateway_pb2_grpc

MODEL = "obs-model"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(cluster, demo_model_dir):
    with http_gateway(
        cluster,
        demo_model_dir,
        "--served-model-name",
        MODEL,
        "--log-format",
        "json",
        "--log-stats-interval",
        "0",
    ) as own:
        yield own


def gateway_metrics(stack) -> dict[str, float]:
    return scrape_metrics(stack.http + "/metrics")


def decoder_metrics(cluster) -> dict[str, float]:
    return scrape_metrics(f"http://127.0.0.1:{cluster.metrics_ports['decoder']}/metrics")


def g(name: str, **labels: str) -> str:
    """A gateway sample's key: `model_name` plus `labels`."""
    pairs = sorted({"model_name": MODEL, **labels}.items())
    return name + "{" + ",".join(f"{k}={v}" for k, v in pairs) + "}"


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def post(stack, body: dict, request_id: str) -> httpx.Response:
    return httpx.post(
        stack.http + "/v1/chat/completions",
        json={"model": MODEL, "temperature": 0, "max_tokens": 8, **body},
        headers={"X-Request-Id": request_id},
        timeout=120,
    )


def text_message(content) -> list[dict]:
    return [{"role": "user", "content": content}]


def image_message(image: bytes, text: str) -> list[dict]:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    return text_message(
        [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    )


def log_lines(stack) -> list[dict]:
    return [json.loads(line) for line in stack.log_text("gateway").splitlines() if line.strip()]


def access_line(stack, request_id: str) -> dict:
    found = [
        line
        for line in log_lines(stack)
        if line["logger"] == "tessera.gateway.access" and line.get("request_id") == request_id
    ]
    assert len(found) == 1, found
    return found[0]


def test_a_request_moves_the_request_metrics_and_logs_one_access_line(stack):
    before = gateway_metrics(stack)
    request_id = f"obs-{uuid.uuid4().hex[:8]}"
    response = post(stack, {"messages": text_message("count me in")}, request_id)
    assert response.status_code == 200, response.text
    body = response.json()
    usage, reason = body["usage"], body["choices"][0]["finish_reason"]
    after = gateway_metrics(stack)
    assert delta(before, after, g("tessera_gateway_requests_total", outcome="ok")) == 1
    assert (
        delta(before, after, g("tessera_gateway_request_success_total", finished_reason=reason))
        == 1
    )
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    assert delta(before, after, g("tessera_gateway_prompt_tokens_total")) == prompt
    assert delta(before, after, g("tessera_gateway_generation_tokens_total")) == completion
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta(before, after, g(f"tessera_gateway_{histogram}_count")) == 1
    assert delta(before, after, g("tessera_gateway_inter_token_latency_seconds_count")) >= 1
    assert after[g("tessera_gateway_num_requests_running")] == 0
    assert after[g("tessera_gateway_num_requests_waiting")] == 0

    line = access_line(stack, request_id)
    assert line["protocol"] == "http" and line["status"] == "200" and line["model"] == MODEL
    assert line["prompt_tokens"] == prompt and line["output_tokens"] == completion
    assert line["finish_reason"] == reason and line["media_items"] == 0
    assert 0 < line["ttft_seconds"] <= line["total_seconds"]
    assert line["level"] == "INFO" and line["message"] == "request" and "ts" in line


def test_a_grpc_request_is_logged_as_grpc(stack):
    request_id = f"obs-grpc-{uuid.uuid4().hex[:8]}"
    with Client(stack.address("gateway")) as client:
        done = client.complete([Message("user", ["over gRPC"])], request_id=request_id)
    line = access_line(stack, request_id)
    assert line["protocol"] == "grpc" and line["status"] == "OK"
    assert line["output_tokens"] == len(done.token_ids)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": text_message("hot"), "temperature": -1},  # refused by the front
        {"messages": "not a list"},  # refused while the body is read
    ],
)
def test_a_rejected_request_counts_as_invalid(stack, body):
    before = gateway_metrics(stack)
    request_id = f"obs-bad-{uuid.uuid4().hex[:8]}"
    assert post(stack, body, request_id).status_code == 400
    after = gateway_metrics(stack)
    assert delta(before, after, g("tessera_gateway_requests_total", outcome="invalid")) == 1
    assert delta(before, after, g("tessera_gateway_requests_total", outcome="ok")) == 0
    assert access_line(stack, request_id)["status"] == "400"


def test_a_stop_string_finish_is_a_stop_not_a_cancellation(stack):
    messages = text_message("stop me somewhere")
    full = post(stack, {"messages": messages, "max_tokens": 12}, "obs-full").json()
    text = full["choices"][0]["message"]["content"]
    stop = text[len(text) // 2 :][:2]
    assert stop.strip(), f"no usable stop string in {text!r}"
    before = gateway_metrics(stack)
    request_id = f"obs-stop-{uuid.uuid4().hex[:8]}"
    stopped = post(stack, {"messages": messages, "max_tokens": 12, "stop": [stop]}, request_id)
    assert stopped.json()["choices"][0]["finish_reason"] == "stop"
    after = gateway_metrics(stack)
    assert (
        delta(before, after, g("tessera_gateway_request_success_total", finished_reason="stop"))
        == 1
    )
    assert (
        delta(before, after, g("tessera_gateway_request_success_total", finished_reason="abort"))
        == 0
    )
    assert delta(before, after, g("tessera_gateway_cancellations_total")) == 0
    assert delta(before, after, g("tessera_gateway_requests_total", outcome="ok")) == 1
    assert access_line(stack, request_id)["finish_reason"] == "stop"


def test_a_repeated_image_hits_the_encoders_memory_tier(stack):
    image = noise_image(int(uuid.uuid4().int % 100000) + 7000, 32, 24)
    messages = image_message(image, "what is it?")
    queries = "tessera_gateway_encoder_cache_queries_total"
    hits = "tessera_gateway_encoder_cache_hits_total"
    first_before = gateway_metrics(stack)
    assert post(stack, {"messages": messages}, "obs-img-1").status_code == 200
    first = gateway_metrics(stack)
    assert delta(first_before, first, g(queries, tier="memory")) == 1
    # A new item: memory misses it and Redis is asked, unless the decoder's fetch reached
    # the encoder first and started its encode, which the gateway's Encode then joins (a
    # memory hit). Which one happens is a race; that exactly one does is not.
    first_memory_hits = delta(first_before, first, g(hits, tier="memory"))
    assert first_memory_hits + delta(first_before, first, g(queries, tier="redis")) == 1
    request_id = f"obs-img-{uuid.uuid4().hex[:8]}"
    assert post(stack, {"messages": messages}, request_id).status_code == 200
    second = gateway_metrics(stack)
    assert delta(first, second, g(queries, tier="memory")) == 1
    assert delta(first, second, g(hits, tier="memory")) == 1
    assert delta(first, second, g(queries, tier="redis")) == 0
    line = access_line(stack, request_id)
    assert line["media_items"] == 1 and line["media_items_cached"] == 1


def test_a_repeated_prompt_hits_the_decoders_prefix_cache(stack, cluster, demo_model_dir):
    label = f"model_name={Path(demo_model_dir).name}"
    messages = text_message(f"{uuid.uuid4().hex} " + "a long shared prefix " * 40)
    post(stack, {"messages": messages, "max_tokens": 2}, "obs-prefix-1")
    before, gateway_before = decoder_metrics(cluster), gateway_metrics(stack)
    response = post(stack, {"messages": messages, "max_tokens": 2}, "obs-prefix-2").json()
    after, gateway_after = decoder_metrics(cluster), gateway_metrics(stack)
    cached = response["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    prompt = response["usage"]["prompt_tokens"]
    queries = delta(before, after, "tessera_decoder_prefix_cache_queries_total{" + label + "}")
    assert queries == prompt
    assert delta(before, after, "tessera_decoder_prefix_cache_hits_total{" + label + "}") == cached
    assert (
        delta(gateway_before, gateway_after, g("tessera_gateway_prompt_tokens_cached_total"))
        == cached
    )
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert "tessera_decoder_" + gauge + "{" + label + "}" in after


def test_decode_tokens_count_where_their_keys_came_from(stack, cluster, demo_model_dir):
    """A request decoding alone: every decode token after the first (drawn from the
    prefill) is attended over the decode mirror's row, none over a gather."""
    label = "{model_name=" + Path(demo_model_dir).name + "}"
    mirrored = "tessera_decoder_decode_tokens_mirrored_total" + label
    gathered = "tessera_decoder_decode_tokens_gathered_total" + label
    before = decoder_metrics(cluster)
    body = {"messages": text_message(uuid.uuid4().hex), "max_tokens": 6, "ignore_eos": True}
    response = post(stack, body, "obs-mirror").json()
    after = decoder_metrics(cluster)
    assert response["usage"]["completion_tokens"] == 6
    assert delta(before, after, mirrored) == 5
    assert delta(before, after, gathered) == 0


def test_the_stats_line_aggregates_the_gateway_and_the_decoders(cluster):
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, MODEL)
    address = cluster.address("decoder")

    async def run() -> tuple[str | None, str | None]:
        async with grpc.aio.insecure_channel(address) as channel:
            stats = StatsLogger(
                registry, MODEL, lambda: decoders_stats([address], lambda _: channel)
            )
            idle = await stats.log_once()
            metrics.admitted()
            metrics.first_token(0.1)
            metrics.left(waiting=False, cancelled=False)
            metrics.finished(FinishedRequest("stop", 100, 25, 10, 0.5), embedding_bytes=0)
            metrics.request_ended("ok")
            metrics.encoder_cache(ItemSources(memory=1, redis=1, computed=2))
            return idle, await stats.log_once()

    idle, line = asyncio.run(run())
    assert idle is None  # nothing happened: nothing logged
    assert line is not None
    assert re.search(r"Avg prompt throughput: [\d.]+ tokens/s", line)
    assert "Running: 0 reqs, Waiting: 0 reqs" in line
    assert "Prefix cache hit rate: 25.0%" in line
    assert "Encoder cache hit rate: 50.0% (memory 25.0%, redis 33.3%)" in line


def test_every_log_line_is_json(stack):
    lines = log_lines(stack)  # raises on any line that is not JSON
    assert lines and all({"ts", "level", "logger", "message"} <= set(line) for line in lines)


def test_the_dashboard_queries_only_documented_exported_metrics(stack, cluster):
    dashboard = json.loads((REPO / "deploy/grafana/tessera.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert exprs
    queried = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for expr in exprs
        for name in re.findall(r"\btessera_[a-z0-9_]+", expr)
    }
    documented = (REPO / "docs/metrics.md").read_text()
    encoder = scrape_metrics(f"http://127.0.0.1:{cluster.metrics_ports['encoder']}/metrics")
    exported = {
        re.sub(r"_(bucket|count|sum)\{.*$|\{.*$", "", key)
        for samples in (gateway_metrics(stack), decoder_metrics(cluster), encoder)
        for key in samples
    }
    for name in sorted(queried):
        assert f"`{name}`" in documented, f"{name} is not in docs/metrics.md"
        assert name in exported, f"{name} is not exported"


def test_a_grpc_request_refused_before_generation_is_counted_and_logged(stack):
    before = gateway_metrics(stack)
    request_id = f"obs-grpc-bad-{uuid.uuid4().hex[:8]}"
    empty_part = gateway_pb2.ChatMessage(role="user", content=[gateway_pb2.ContentPart()])
    request = gateway_pb2.GenerateRequest(request_id=request_id, messages=[empty_part])
    with grpc.insecure_channel(stack.address("gateway")) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(request, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    after = gateway_metrics(stack)
    assert delta(before, after, g("tessera_gateway_requests_total", outcome="invalid")) == 1
    assert access_line(stack, request_id)["status"] == "INVALID_ARGUMENT"
