"""Health, reflection, start lines and a clean shutdown on SIGTERM."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tessera import __version__
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc
from tests.cluster import Cluster

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
