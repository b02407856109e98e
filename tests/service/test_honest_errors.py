"""Errors mean what they say, and the front door does not pay for what cannot fit.

- An item an encoder refuses is the request's fault: the decoder answers
  INVALID_ARGUMENT (it used to answer UNAVAILABLE, so the gateway set a healthy decoder
  aside, replayed the request and answered 503 "no decoder is reachable").
- Encoders that cannot be reached are not the decoder's fault: FAILED_PRECONDITION, and
  the gateway keeps the decoder (tested in test_decoder_discovery.py, with a decoder
  whose only encoder is not there: a decoder dials no address a request names).
- Text longer than the context could hold is refused before it is tokenized (a 20 MB
  text used to cost the gateway gigabytes of memory and seconds).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tessera.client import Client, Message
from tessera.placeholders import Modality, PlaceholderRange
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import noise_image
from tessera.v1 import (
    common_pb2,
    decoder_pb2,
    decoder_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
)
from tessera.wire import range_to_proto

ENCODER_MAX_PIXELS = 2000  # the strict encoder's limit; the gateway's is the default


@pytest.fixture(scope="module")
def strict(demo_model_dir):
    """A gateway that accepts what its only encoder refuses (a limit set lower there)."""
    own = Cluster()
    try:
        own.start_stack(demo_model_dir, ["--max-image-pixels", str(ENCODER_MAX_PIXELS)])
        own.wait_ready()
        yield own
    finally:
        own.stop()


def test_an_item_the_encoder_refuses_is_invalid_and_the_decoder_stays_in_service(strict):
    greedy = common_pb2.SamplingParams(max_tokens=4)
    with Client(strict.address("gateway"), max_retries=0) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.complete([Message("user", [noise_image(1, 64, 64), "What?"])], greedy)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"above the limit of {ENCODER_MAX_PIXELS}" in refused.value.details()
        # At once, no retry window: the decoder was not set aside.
        done = client.complete([Message("user", [noise_image(2, 32, 32), "What?"])], greedy)
    assert len(done.token_ids) == 4


def direct_request(case: str, data: bytes, encoders: list[str]) -> decoder_pb2.DecodeRequest:
    """A prompt with one 16-row image item (the demo LLaVA's) whose hash no encoder has seen."""
    placeholder = 3  # the demo's <image> token
    prompt = [1, 4, 10, *([placeholder] * 16), 11, 2]
    item = PlaceholderRange(Modality.IMAGE, "cd" * 32, 3, 16)
    return decoder_pb2.DecodeRequest(
        request_id="direct-" + case.replace(" ", "-"),
        prompt_token_ids=prompt,
        items=[
            decoder_pb2.MediaSource(
                range=range_to_proto(item), encoder_addresses=encoders, data=data
            )
        ],
        sampling=common_pb2.SamplingParams(max_tokens=2),
    )


@pytest.mark.parametrize(
    "case,data,code",
    [
        ("bytes that are no image", b"not an image", grpc.StatusCode.INVALID_ARGUMENT),
        ("no bytes to encode from", b"", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_the_decoder_says_whose_fault_a_failed_fetch_is(cluster, case, data, code):
    encoders = [cluster.address("encoder")]
    with grpc.insecure_channel(cluster.address("decoder")) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            list(stub.Generate(direct_request(case, data, encoders), timeout=60))
    assert failed.value.code() == code, (case, failed.value.details())


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_text_beyond_the_context_is_refused_before_tokenizing(cluster):
    gateway_pid = cluster.child("gateway").process.pid
    huge = "word " * (4 << 20)  # 20 MiB
    request = gateway_pb2.GenerateRequest(
        messages=[
            gateway_pb2.ChatMessage(role="user", content=[gateway_pb2.ContentPart(text=huge)])
        ],
        sampling=common_pb2.SamplingParams(max_tokens=2),
    )
    before = rss_bytes(gateway_pid)
    with (
        grpc.insecure_channel(
            cluster.address("gateway"), options=[("grpc.max_send_message_length", 64 << 20)]
        ) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        list(gateway_pb2_grpc.GatewayServiceStub(channel).Generate(request, timeout=120))
    growth = rss_bytes(gateway_pid) - before
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "characters of text" in refused.value.details()
    assert growth < 100 << 20, f"the gateway grew by {growth >> 20} MiB"
