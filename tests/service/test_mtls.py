"""Mutual TLS on every gRPC hop, through real processes: a stack whose encoder, decoder
and gateway each hold their role's certificate answers like the model itself; each
service refuses callers without a certificate of its CA, and methods to roles that may
not call them; certificates rotate without a restart, on the server and the client side."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tessera.certs import Authority, install, issue, new_authority, write_role_certificates
from tessera.channels import ChannelPool
from tessera.client import Client, Message
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.tls import TlsFiles, sync_channel
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc

pytestmark = pytest.mark.slow

SERVICES = ("encoder", "decoder", "gateway")
PROMPT = [("user", [noise_image(71, 40, 30), "What is in this picture?"])]
MAX_NEW_TOKENS = 6
DENIED = grpc.StatusCode.PERMISSION_DENIED
REQUEST_NUMBERS = itertools.count()


@dataclass(frozen=True)
class Certificates:
    authority: Authority
    roles: dict[str, TlsFiles]  # gateway, decoder, encoder, client
    foreign: dict[str, TlsFiles]  # the same roles, from another CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    directory = tmp_path_factory.mktemp("tls")
    authority = new_authority()
    roles = write_role_certificates(directory / "ours", authority=authority)
    foreign = write_role_certificates(directory / "other", authority=new_authority("other CA"))
    return Certificates(authority, roles, foreign)


@pytest.fixture(scope="module")
def stack(demo_model_dir, certs):
    own = Cluster(client_tls=certs.roles["client"])
    try:
        # GetStats narrowed from any caller: shows --allow-callers takes effect. Only
        # the encoder serves reflection.
        encoder_args = ["--allow-callers", "GetStats=decoder,gateway", "--enable-reflection"]
        own.start_stack(demo_model_dir, encoder_args, tls=certs.roles)
        own.wait_ready()
        yield own
    finally:
        own.stop()


def health_status(address: str, tls: TlsFiles | None) -> int:
    with sync_channel(address, tls) as channel:
        request = health_pb2.HealthCheckRequest()
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=10).status


def rpc_error(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        result = call()
        if isinstance(result, Iterator):  # a stream fails when read
            list(result)
    return raised.value


def test_a_request_over_every_hop_answers_like_the_model(stack, certs, reference):
    """gateway -> encoder (Encode), gateway -> decoder (Generate), decoder -> encoder
    (GetEmbeddingRows, GetEmbeddingSlices if it falls back), each hop under mutual TLS
    and the role checks."""
    expected = reference.generate(PROMPT, MAX_NEW_TOKENS)
    messages = [Message(role, parts) for role, parts in PROMPT]
    sampling = common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)
    with Client(stack.address("gateway"), tls=certs.roles["client"]) as client:
        done = client.complete(messages, sampling)
    assert done.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(done.token_ids, expected, "mtls")
    assert done.stats.num_items_computed == 1  # the encoder computed it
    assert done.stats.decoder.num_embedding_bytes > 0  # the decoder fetched its rows
    # Not refused the batched read (a refusal would only show as a slower fallback).
    assert "GetEmbeddingRows: caller" not in stack.log_text("encoder")
    for name in SERVICES:
        assert "address=" in stack.log_text(name) and "transport=mtls" in stack.log_text(name)


def test_tessera_generate_takes_the_tls_flags(stack, certs):
    image = Path(certs.roles["client"].ca_file).with_name("image.png")
    image.write_bytes(PROMPT[0][1][0])
    command = [
        sys.executable, "-m", "tessera.cli", "generate", PROMPT[0][1][1], "--json",
        "--server", stack.address("gateway"), "--image", str(image),
        "--max-tokens", str(MAX_NEW_TOKENS),
    ]  # fmt: skip
    files = certs.roles["client"]
    flags = ["--tls-cert-file", files.cert_file, "--tls-key-file", files.key_file]
    flags += ["--tls-ca-file", files.ca_file]
    answered = subprocess.run([*command, *flags], capture_output=True, text=True, timeout=120)
    assert answered.returncode == 0, answered.stderr
    messages = [Message(role, parts) for role, parts in PROMPT]
    with Client(stack.address("gateway"), tls=files) as client:
        done = client.complete(messages, common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS))
    assert json.loads(answered.stdout)["token_ids"] == done.token_ids
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "tessera generate: UNAVAILABLE" in refused.stderr


@pytest.mark.parametrize("service", SERVICES)
def test_only_callers_with_a_certificate_of_the_ca_get_through(stack, certs, service):
    address = stack.address(service)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health_status(address, certs.roles["client"]) == serving  # health: any role
    no_certificate = TlsFiles(ca_file=certs.roles["client"].ca_file)
    other = certs.foreign["gateway"]
    other_ca = TlsFiles(other.cert_file, other.key_file, certs.roles["client"].ca_file)
    for refused in [None, no_certificate, other_ca]:  # plaintext, no cert, another CA's
        error = rpc_error(lambda refused=refused: health_status(address, refused))
        assert error.code() == grpc.StatusCode.UNAVAILABLE, (refused, error)


def encoder_stub(stack, files: TlsFiles) -> encoder_pb2_grpc.EncoderServiceStub:
    return encoder_pb2_grpc.EncoderServiceStub(sync_channel(stack.address("encoder"), files))


def decoder_stub(stack, files: TlsFiles) -> decoder_pb2_grpc.DecoderServiceStub:
    return decoder_pb2_grpc.DecoderServiceStub(sync_channel(stack.address("decoder"), files))


def decode_request(max_tokens: int) -> decoder_pb2.DecodeRequest:
    return decoder_pb2.DecodeRequest(
        request_id=f"mtls-{next(REQUEST_NUMBERS)}",
        prompt_token_ids=[1, 5, 205, 6, 205],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )


def test_each_method_refuses_the_roles_that_may_not_call_it(stack, certs):
    roles = certs.roles
    slices = encoder_pb2.GetEmbeddingSlicesRequest()
    refusals = {
        ("client", "Encode"): lambda: encoder_stub(stack, roles["client"]).Encode(
            encoder_pb2.EncodeRequest(), timeout=10
        ),
        ("client", "GetEmbeddingSlices"): lambda: encoder_stub(
            stack, roles["client"]
        ).GetEmbeddingSlices(slices, timeout=10),
        ("client", "GetEmbeddingRows"): lambda: list(
            encoder_stub(stack, roles["client"]).GetEmbeddingRows(slices, timeout=10)
        ),
        ("encoder", "Encode"): lambda: encoder_stub(stack, roles["encoder"]).Encode(
            encoder_pb2.EncodeRequest(), timeout=10
        ),
        ("gateway", "Expedite"): lambda: encoder_stub(stack, roles["gateway"]).Expedite(
            encoder_pb2.ExpediteRequest(), timeout=10
        ),
        ("client", "GetStats"): lambda: encoder_stub(stack, roles["client"]).GetStats(
            encoder_pb2.GetEncoderStatsRequest(), timeout=10
        ),  # narrowed by --allow-callers
        ("client", "Generate"): lambda: decoder_stub(stack, roles["client"]).Generate(
            decode_request(2), timeout=10
        ),
        ("decoder", "Generate"): lambda: decoder_stub(stack, roles["decoder"]).Generate(
            decode_request(2), timeout=10
        ),
    }
    for (role, method), call in refusals.items():
        error = rpc_error(call)
        assert error.code() == DENIED, (role, method, error)
        assert f"/{method}: caller '{role}' is not allowed" in error.details()


def test_the_roles_a_method_names_get_through(stack, certs):
    roles = certs.roles
    stats = encoder_stub(stack, roles["decoder"]).GetStats(encoder_pb2.GetEncoderStatsRequest())
    assert stats.ByteSize() > 0
    released = encoder_pb2.ReleaseLeasesRequest(lease_owner="nobody")
    encoder_stub(stack, roles["gateway"]).ReleaseLeases(released, timeout=10)
    unknown = encoder_pb2.ExpediteRequest(content_hashes=["ab" * 32])
    assert encoder_stub(stack, roles["decoder"]).Expedite(unknown, timeout=10).num_in_flight == 0
    # The decoder's way of reading rows (an empty call: nothing to stream, but let through).
    nothing = encoder_pb2.GetEmbeddingSlicesRequest()
    assert list(encoder_stub(stack, roles["decoder"]).GetEmbeddingRows(nothing, timeout=10)) == []
    decoder_stats = decoder_pb2.GetDecoderStatsRequest()
    decoder_stub(stack, roles["client"]).GetStats(decoder_stats, timeout=10)  # any caller
    stream = decoder_stub(stack, roles["gateway"]).Generate(decode_request(3), timeout=60)
    tokens = [t for response in stream for t in response.tokens.token_ids]
    assert len(tokens) == 3


def test_reflection_only_with_its_flag_and_to_any_certificate(stack, certs):
    with sync_channel(stack.address("decoder"), certs.roles["client"]) as channel:
        error = rpc_error(ProtoReflectionDescriptorDatabase(channel).get_services)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    with sync_channel(stack.address("encoder"), certs.roles["client"]) as channel:
        listed = ProtoReflectionDescriptorDatabase(channel).get_services()
    assert "tessera.v1.EncoderService" in listed  # a bidirectional stream, checked too


def peer_certificate(address: str, client: TlsFiles) -> x509.Certificate:
    """The certificate a server shows a new connection (a TLS handshake of our own)."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=client.ca_file)
    context.load_cert_chain(client.cert_file, client.key_file)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as connection,
    ):
        return x509.load_der_x509_certificate(connection.getpeercert(binary_form=True))


def test_a_server_certificate_rotates_without_a_restart(stack, certs):
    address, client = stack.address("encoder"), certs.roles["client"]
    before = peer_certificate(address, client)
    rotated = issue(certs.authority, "encoder")
    install(rotated, certs.roles["encoder"])
    after = peer_certificate(address, client)
    assert after.serial_number != before.serial_number
    assert after == x509.load_pem_x509_certificate(rotated.cert_pem)
    assert stack.child("encoder").process.poll() is None  # the same process
    assert "TLS files reloaded: CN=encoder" in stack.log_text("encoder")
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health_status(address, client) == serving  # gRPC accepts the new one too


def test_a_channel_pool_presents_a_rotated_certificate_and_lets_old_calls_finish(
    stack, certs, tmp_path
):
    """The pool's caller is named in the decoder's refusals: a gateway certificate may
    generate, and once the files hold a `client` one, new calls are refused as 'client'
    while the stream begun on the old channel still runs to its end."""
    files = write_role_certificates(tmp_path, ["gateway"], certs.authority)["gateway"]
    address = stack.address("decoder")

    async def scenario() -> tuple[int, grpc.aio.AioRpcError]:
        pool = ChannelPool(tls=files, tls_recheck_seconds=0)
        try:
            old = pool.get(address)
            stream = decoder_pb2_grpc.DecoderServiceStub(old).Generate(
                decode_request(40), timeout=60
            )
            first = await stream.read()
            install(issue(certs.authority, "client"), files)
            new = pool.get(address)
            assert new is not old
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await (
                    decoder_pb2_grpc.DecoderServiceStub(new)
                    .Generate(decode_request(1), timeout=10)
                    .read()
                )
            tokens = list(first.tokens.token_ids)
            while (response := await stream.read()) is not grpc.aio.EOF:
                tokens += response.tokens.token_ids
            return len(tokens), refused.value
        finally:
            await pool.close()

    received, refused = asyncio.run(scenario())
    assert refused.code() == DENIED and "caller 'client'" in refused.details()
    assert received == 40
