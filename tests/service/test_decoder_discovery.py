"""The decoder dials only the encoders it discovered itself (`--encoders`).

A DecodeRequest's encoder addresses are hints that order the decoder's own encoders;
an address it did not discover is never dialed, however the request names it. Before,
anyone who could reach a decoder could make it connect to any host:port, and each such
address kept a channel open forever.

The session cluster's decoder knows the session's two encoders. This module adds three
decoders around the same encoder: one that finds it through DNS (beside a static address
where no encoder answers), one with no `--encoders` at all, and one whose only encoder is
not there.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator

import grpc
import pytest

from tessera.client import Client, Completion, Message
from tessera.media import decode_image
from tessera.rendezvous import rendezvous_order
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc
from tests.direct import image_decode_request

MAX_NEW_TOKENS = 6


class Trap:
    """A TCP port on loopback that counts the connections made to it and drops each at
    once (so a client that does dial it fails fast rather than hangs)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.2)  # how often the loop looks at `_stop`, not a wait
        self.address = f"127.0.0.1:{self._socket.getsockname()[1]}"
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


@pytest.fixture(scope="module")
def trap() -> Iterator[Trap]:
    listener = Trap()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def decoders(demo_model_dir, cluster) -> Iterator[Cluster]:
    own = Cluster()
    # 8 MiB of KV cache (1024 blocks of the tiny model) start three decoders faster than
    # the default 1 GiB each.
    model = ["--model", str(demo_model_dir), "--kv-cache-bytes", str(8 << 20)]
    encoder_port = cluster.address("encoder").rsplit(":", 1)[1]
    # Bound, never listening: connections to it are refused, and no other process can
    # take the port while the module runs.
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))
    nowhere = f"127.0.0.1:{reserved.getsockname()[1]}"
    try:
        targets = f"dns:///localhost:{encoder_port},{nowhere}"
        own.start("dns-decoder", "decoder", [*model, "--encoders", targets])
        own.start("lone-decoder", "decoder", model)
        own.start("stranded-decoder", "decoder", [*model, "--encoders", nowhere])
        own.nowhere = nowhere
        own.wait_ready()
        yield own
    finally:
        own.stop()
        reserved.close()


@pytest.fixture(scope="module")
def fingerprint(cluster) -> str:
    match = re.search(r"fingerprint=(\w+)", cluster.log_text("gateway"))
    assert match
    return match.group(1)


def through_gateway(cluster, image: bytes) -> Completion:
    """The normal path, to compare with: the gateway builds the prompt and hints."""
    with Client(cluster.address("gateway")) as client:
        return client.complete(
            [Message("user", [image, "What is shown?"])],
            common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS),
        )


def direct_request(
    completion: Completion,
    image: bytes,
    content_hash: str,
    placeholder_token_id: int,
    hints: list[str],
    request_id: str,
) -> decoder_pb2.DecodeRequest:
    """The gateway's prompt for `image`, sent straight to a decoder with `hints`."""
    return image_decode_request(
        completion.prompt_token_ids,
        placeholder_token_id,
        image,
        content_hash,
        request_id,
        hints,
        max_tokens=MAX_NEW_TOKENS,
    )


def generate(address: str, request) -> tuple[list[int], decoder_pb2.DecodeFinished]:
    with grpc.insecure_channel(address) as channel:
        responses = list(decoder_pb2_grpc.DecoderServiceStub(channel).Generate(request, timeout=60))
    tokens = [t for r in responses if r.HasField("tokens") for t in r.tokens.token_ids]
    return tokens, responses[-1].finished


def refusal(address: str, request) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(request, timeout=60))
    return refused.value


@pytest.fixture(scope="module")
def case(cluster, fingerprint, reference):
    """An image answered once through the gateway, and a way to send the same prompt
    straight to a decoder with any hints."""
    image = noise_image(1201, 36, 36)
    content_hash = decode_image(image).content_hash(fingerprint)
    completion = through_gateway(cluster, image)

    def request(hints: list[str], request_id: str) -> decoder_pb2.DecodeRequest:
        return direct_request(
            completion, image, content_hash, reference.placeholder_token_id, hints, request_id
        )

    return completion, content_hash, request


def test_an_address_the_decoder_did_not_discover_is_never_dialed(cluster, trap, case):
    completion, _, request = case
    hints = [trap.address, cluster.address("encoder")]
    tokens, _ = generate(cluster.address("decoder"), request(hints, "undiscovered-first"))
    assert tokens == completion.token_ids
    assert trap.accepted == 0


def test_only_unknown_hints_route_by_the_decoders_own_order(cluster, trap, case):
    """The decoder knows `encoder` (which holds the item since the gateway's request) and
    `small-encoder` (which never saw it and must encode it from the request's bytes)."""
    completion, content_hash, request = case
    own = [cluster.address("encoder"), cluster.address("small-encoder")]
    tokens, finished = generate(cluster.address("decoder"), request([trap.address], "unknown"))
    assert tokens == completion.token_ids
    assert trap.accepted == 0
    first = rendezvous_order(content_hash, own)[0]
    assert finished.stats.num_reencoded_items == int(first == cluster.address("small-encoder"))


def test_a_decoder_finds_its_encoders_through_dns(decoders, cluster, case):
    """`--encoders dns:///localhost:PORT`, and a request with no hints at all."""
    completion, _, request = case
    tokens, _ = generate(decoders.address("dns-decoder"), request([], "dns"))
    assert tokens == completion.token_ids
    assert re.search(
        rf"encoder replicas: .*{re.escape(cluster.address('encoder'))}",
        decoders.log_text("dns-decoder"),
    )


def test_a_discovered_encoder_that_is_down_is_routed_around(decoders, cluster, case):
    """The request ranks the dead one first; the decoder tries it, then the next."""
    completion, _, request = case
    hints = [decoders.nowhere, cluster.address("encoder")]
    tokens, _ = generate(decoders.address("dns-decoder"), request(hints, "dead-first"))
    assert tokens == completion.token_ids
    failed = f"encoder {decoders.nowhere} failed (UNAVAILABLE); trying the next"
    assert failed in decoders.log_text("dns-decoder")


def test_a_decoder_without_encoders_refuses_media_and_names_the_flag(decoders, cluster, case):
    _, _, request = case
    error = refusal(decoders.address("lone-decoder"), request([cluster.address("encoder")], "x"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--encoders" in error.details()
    text_only = decoder_pb2.DecodeRequest(
        request_id="text-only",
        prompt_token_ids=[1, 5, 205, 6],
        sampling=common_pb2.SamplingParams(max_tokens=2),
    )
    tokens, _ = generate(decoders.address("lone-decoder"), text_only)
    assert len(tokens) == 2


def test_unreachable_encoders_are_not_the_decoders_fault(decoders, cluster, case):
    """Its one encoder is not there: FAILED_PRECONDITION (the gateway keeps the decoder
    and answers 503), even though the request names a reachable encoder it may not use."""
    _, _, request = case
    hints = [cluster.address("encoder")]
    error = refusal(decoders.address("stranded-decoder"), request(hints, "stranded"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{decoders.nowhere}: UNAVAILABLE" in error.details()
