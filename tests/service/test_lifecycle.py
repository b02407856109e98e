"""Health, reflection (asked for), start lines and a clean shutdown on SIGTERM."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tessera import __version__
from tessera.certs import write_role_certificates
from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster
from tessera.tls import tls_args
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc

SERVICES = {
    "gateway": "tessera.v1.GatewayService",
    "encoder": "tessera.v1.EncoderService",
    "decoder": "tessera.v1.DecoderService",
}


@pytest.mark.parametrize("name", list(SERVICES))
def test_health_reflection_and_start_line(cluster, name):
    with grpc.insecure_channel(cluster.address(name)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ["", SERVICES[name]]:
            response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        listed = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert SERVICES[name] in listed and "grpc.health.v1.Health" in listed
    log = cluster.log_text(name)
    ready_lines = [
        line for line in log.splitlines() if f"tessera {name} {__version__} ready" in line
    ]
    assert len(ready_lines) == 1
    assert "model=" in ready_lines[0] and cluster.address(name) in ready_lines[0]
    # No flags, no TLS: anyone may call, and the start says so.
    assert "transport=plaintext" in ready_lines[0]
    assert f"tessera {name} accepts unauthenticated callers (plaintext)" in log
    assert re.search(r" torch_threads=[1-9]\d*$", ready_lines[0]), ready_lines[0]


def test_decoder_runs_the_exactness_tests_on_onednn_linears(cluster, run_on):
    """The session's decoder (--linear-kernel onednn) runs every exactness test against
    generate() on oneDNN (on a CPU in float32; torch's linears elsewhere)."""
    expected = "onednn" if run_on.is_default and torch.backends.mkldnn.is_available() else "torch"
    assert cluster.ready_field("decoder", "linear") == expected


def test_ready_line_names_the_torch_threads_it_was_given(cluster):
    """With several services on one host, each one's share of the CPUs shows at start."""
    (ready,) = [
        line for line in cluster.log_text("small-encoder").splitlines() if " ready: " in line
    ]
    assert ready.endswith(" torch_threads=1"), ready


def test_health_port_answers_probes_without_a_certificate_and_serves_nothing_else(
    demo_model_dir, tmp_path
):
    """Under mutual TLS the kubelet's grpc probes (no client certificate) reach only
    --health-port: plaintext, health and nothing else, while the main port refuses them."""
    certs = write_role_certificates(tmp_path / "tls")
    health_port = free_port()
    own = Cluster(client_tls=certs["client"])
    flags = ["--model", str(demo_model_dir), "--health-port", str(health_port)]
    address = own.start("encoder", "encoder", [*flags, *tls_args(certs["encoder"])])
    try:
        own.wait_ready()
        request = health_pb2.HealthCheckRequest
        with grpc.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ["", SERVICES["encoder"]]:
                status = health.Check(request(service=service), timeout=10).status
                assert status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as other:
                stub = encoder_pb2_grpc.EncoderServiceStub(channel)
                stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
            assert other.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as refused:
            health_pb2_grpc.HealthStub(channel).Check(request(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"health_address=127.0.0.1:{health_port}" in own.log_text("encoder")
        assert own.terminate("encoder") == 0
    finally:
        own.stop()


def test_sigterm_lets_the_request_in_flight_finish(demo_model_dir):
    """Health flips to NOT_SERVING at once; the stream in flight still completes."""
    own = Cluster()
    address = own.start(
        "decoder", "decoder", ["--model", str(demo_model_dir), "--drain-seconds", "30"]
    )
    try:
        own.wait_ready()
        first_token = threading.Event()
        received: list[int] = []
        failures: list[BaseException] = []

        def stream() -> None:
            request = decoder_pb2.DecodeRequest(
                request_id="drain",
                prompt_token_ids=[1, 5, 205, 6, 205],
                sampling=common_pb2.SamplingParams(max_tokens=300, ignore_eos=True),
                max_chunk_tokens=1,
            )
            try:
                with grpc.insecure_channel(address) as channel:
                    stub = decoder_pb2_grpc.DecoderServiceStub(channel)
                    for response in stub.Generate(request, timeout=120):
                        received.extend(response.tokens.token_ids)
                        first_token.set()
            except BaseException as error:
                failures.append(error)
                first_token.set()

        thread = threading.Thread(target=stream)
        thread.start()
        assert first_token.wait(60)
        own.child("decoder").process.send_signal(15)
        thread.join(120)
        assert not failures, failures
        assert len(received) == 300
        assert own.child("decoder").process.wait(60) == 0
        assert "stopped" in own.log_text("decoder")
    finally:
        own.stop()


def test_encoder_and_decoder_metrics_parse_and_move(cluster):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tessera.client import Client, Message
    from tessera.testbed.reference import noise_image

    def scrape(name: str) -> dict[str, float]:
        url = f"http://127.0.0.1:{cluster.metrics_ports[name]}/metrics"
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(httpx.get(url, timeout=10).text)
            for sample in family.samples
        }

    encoder, decoder = scrape("encoder"), scrape("decoder")
    with Client(cluster.address("gateway")) as client:
        client.complete([Message("user", [noise_image(1201, 30, 30), "metrics?"])])
    encoder_after, decoder_after = scrape("encoder"), scrape("decoder")
    assert (
        encoder_after["tessera_encoder_items_requested_total"]
        > encoder["tessera_encoder_items_requested_total"]
    )
    assert (
        encoder_after["tessera_encoder_bytes_sent_total"]
        > encoder["tessera_encoder_bytes_sent_total"]
    )
    assert (
        decoder_after["tessera_decoder_finished_total"]
        == decoder["tessera_decoder_finished_total"] + 1
    )
    assert (
        decoder_after["tessera_decoder_embedding_bytes_received_total"]
        > decoder["tessera_decoder_embedding_bytes_received_total"]
    )
    assert 0 <= decoder_after["tessera_decoder_kv_cache_usage_perc"] <= 1
    assert "tessera_encoder_queue_depth" in encoder_after


def test_streams_past_the_drain_time_end_unavailable_without_tracebacks(demo_model_dir):
    """Requests still running when --drain-seconds is up get UNAVAILABLE ("retry"),
    which the gateway retries elsewhere; gRPC used to cancel them and log a traceback
    for each."""
    own = Cluster()
    address = own.start(
        "decoder", "decoder", ["--model", str(demo_model_dir), "--drain-seconds", "0.5"]
    )
    try:
        own.wait_ready()
        started = threading.Barrier(3)
        codes: list[grpc.StatusCode] = []

        def stream(index: int) -> None:
            request = decoder_pb2.DecodeRequest(
                request_id=f"long-{index}",
                prompt_token_ids=[1, 5, 205, 6, 205],
                sampling=common_pb2.SamplingParams(max_tokens=2000, ignore_eos=True),
                max_chunk_tokens=1,
            )
            with grpc.insecure_channel(address) as channel:
                stub = decoder_pb2_grpc.DecoderServiceStub(channel)
                try:
                    for number, _ in enumerate(stub.Generate(request, timeout=120)):
                        if number == 0:
                            started.wait(60)
                except grpc.RpcError as error:
                    codes.append(error.code())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        started.wait(60)  # both are generating
        own.child("decoder").process.send_signal(15)
        for thread in threads:
            thread.join(120)
        assert codes == [grpc.StatusCode.UNAVAILABLE] * 2
        assert own.child("decoder").process.wait(60) == 0
        log = own.log_text("decoder")
        assert "stopped" in log and "Traceback" not in log, log[-2000:]
    finally:
        own.stop()


def test_a_second_server_on_a_taken_port_fails_at_startup(cluster, demo_model_dir):
    """No SO_REUSEPORT: it used to start "ready" and take half the port's clients."""
    port = cluster.address("gateway").rsplit(":", 1)[1]
    started = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "gateway", "--model", str(demo_model_dir),
         "--port", port, "--http-port", "0", "--encoders", cluster.address("encoder"),
         "--decoders", cluster.address("decoder")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode != 0
    assert f"tessera gateway: could not bind 127.0.0.1:{port}" in started.stderr
    assert "Traceback" not in started.stderr
