"""Front door once: an encoder takes the content hashes of a gateway it authenticated
(mutual TLS) as given, and checks everyone else's against the decoded content, through
real processes; such a gateway sends large images already processed, and the encoder
runs its tower on those pixel values only when they come from a caller it trusts. The
counters say which rule each computed item went by."""

from __future__ import annotations

import grpc
import pytest

from tessera.certs import write_role_certificates
from tessera.client import Client, Message
from tessera.media import decode_image
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.tls import TlsFiles, sync_channel
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def roles(tmp_path_factory) -> dict[str, TlsFiles]:
    return write_role_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def stack(demo_model_dir, roles):
    own = Cluster(client_tls=roles["client"])
    try:
        own.start_stack(demo_model_dir, tls=roles)
        own.wait_ready()
        yield own
    finally:
        own.stop()


def encode(
    address: str,
    files: TlsFiles | None,
    image: bytes,
    content_hash: str,
    fingerprint: str,
) -> encoder_pb2.EncodeResponse:
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE, data=image, content_hash=content_hash
    )
    request = encoder_pb2.EncodeRequest(items=[item], model_fingerprint=fingerprint)
    with sync_channel(address, files) as channel:
        return encoder_pb2_grpc.EncoderServiceStub(channel).Encode(request, timeout=60)


def hash_counts(address: str, files: TlsFiles | None) -> tuple[int, int]:
    """(num_hashes_verified, num_hashes_trusted) of the encoder at `address`."""
    with sync_channel(address, files) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        stats = stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
    return stats.num_hashes_verified, stats.num_hashes_trusted


def pixel_counts(address: str, files: TlsFiles | None) -> tuple[int, int]:
    """(num_pixel_values_used, num_pixel_values_ignored) of the encoder at `address`."""
    with sync_channel(address, files) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        stats = stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
    return stats.num_pixel_values_used, stats.num_pixel_values_ignored


def refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def test_a_gateways_hashes_are_taken_as_given_and_its_rows_answer_like_the_model(
    stack, roles, reference
):
    """The item is computed under the gateway's hash unchecked; a request for it is
    then served those rows and still answers exactly as generate()."""
    address, fingerprint = stack.address("encoder"), stack.fingerprint("encoder")
    assert "hashes_trusted_from=gateway" in stack.log_text("encoder")
    image = noise_image(301, 40, 30)
    before = hash_counts(address, roles["gateway"])
    encoded = encode(
        address, roles["gateway"], image, decode_image(image).content_hash(fingerprint), fingerprint
    )
    assert encoded.items[0].source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    verified, trusted = hash_counts(address, roles["gateway"])
    assert (verified - before[0], trusted - before[1]) == (0, 1)

    prompt = [("user", [image, "What is in this picture?"])]
    expected = reference.generate(prompt, MAX_NEW_TOKENS)
    sampling = common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)
    with Client(stack.address("gateway"), tls=roles["client"]) as client:
        done = client.complete([Message(role, parts) for role, parts in prompt], sampling)
    assert done.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(done.token_ids, expected, "rows computed under a trusted hash")
    assert done.stats.num_items_cached == 1  # the rows the trusted Encode computed
    assert hash_counts(address, roles["gateway"]) == (verified, trusted)


def test_hashes_of_callers_not_trusted_are_checked(stack, roles):
    address, fingerprint = stack.address("encoder"), stack.fingerprint("encoder")
    image, other = noise_image(302, 40, 30), noise_image(303, 40, 30)
    wrong_hash = decode_image(other).content_hash(fingerprint)
    before = hash_counts(address, roles["gateway"])
    # A decoder may call Encode (it re-sends items an encoder lost), but is not trusted
    # with hashes; a gateway that names no fingerprint is checked too.
    for files, named in [(roles["decoder"], fingerprint), (roles["gateway"], "")]:
        refused = refusal(lambda f=files, n=named: encode(address, f, image, wrong_hash, n))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not match the item's content" in refused.details()
    right_hash = decode_image(image).content_hash(fingerprint)
    encode(address, roles["decoder"], image, right_hash, fingerprint)
    verified, trusted = hash_counts(address, roles["gateway"])
    assert (verified - before[0], trusted - before[1]) == (3, 0)


def test_an_encode_made_for_another_model_is_refused(stack, roles):
    address, fingerprint = stack.address("encoder"), stack.fingerprint("encoder")
    image = noise_image(304, 40, 30)
    other_model = "0" * 32
    refused = refusal(
        lambda: encode(
            address,
            roles["gateway"],
            image,
            decode_image(image).content_hash(other_model),
            other_model,
        )
    )
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "serves another model" in refused.details()
    assert fingerprint not in refused.details()


def test_without_mutual_tls_every_hash_is_checked(cluster):
    """Plaintext: no caller has a verified name, so a caller that says it names this
    model is still checked, and a request through the gateway is checked too."""
    address, fingerprint = cluster.address("encoder"), cluster.fingerprint("encoder")
    assert "hashes_trusted_from=none" in cluster.log_text("encoder")
    assert "processed_images=off" in cluster.log_text("gateway")  # no certificate to trust
    image, other = noise_image(305, 40, 30), noise_image(306, 40, 30)
    before = hash_counts(address, None)
    wrong_hash = decode_image(other).content_hash(fingerprint)
    refused = refusal(lambda: encode(address, None, image, wrong_hash, fingerprint))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    with Client(cluster.address("gateway")) as client:
        done = client.complete(
            [Message("user", [image, "What is this?"])], common_pb2.SamplingParams(max_tokens=2)
        )
    assert done.stats.num_items_computed + done.stats.num_items_cached == 1
    verified, trusted = hash_counts(address, None)
    assert (verified - before[0], trusted - before[1]) == (2, 0)


# The demo processor makes (3, 56, 56) float32 values: fewer bytes than the pixels of
# LARGE_SIDES, more than those of the 40 x 30 images above.
LARGE_SIDES = (130, 100)


def answer(stack, roles, image: bytes) -> tuple:
    prompt = [("user", [image, "What is in this picture?"])]
    sampling = common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)
    with Client(stack.address("gateway"), tls=roles["client"]) as client:
        done = client.complete([Message(role, parts) for role, parts in prompt], sampling)
    return prompt, done


def test_a_large_image_reaches_the_encoder_processed_and_answers_like_the_model(
    stack, roles, reference
):
    address = stack.address("encoder")
    assert "processed_images=3x56x56" in stack.log_text("gateway")
    before = pixel_counts(address, roles["gateway"]), hash_counts(address, roles["gateway"])
    prompt, done = answer(stack, roles, noise_image(311, *LARGE_SIDES))
    assert done.stats.num_items_computed == 1
    assert pixel_counts(address, roles["gateway"]) == (before[0][0] + 1, before[0][1])
    verified, trusted = hash_counts(address, roles["gateway"])
    assert (verified - before[1][0], trusted - before[1][1]) == (0, 1)
    expected = reference.generate(prompt, MAX_NEW_TOKENS)
    assert done.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(done.token_ids, expected, "an image the gateway processed")

    # A small image goes as its file: its pixel values would be more bytes.
    _, done = answer(stack, roles, noise_image(312, 40, 30))
    assert done.stats.num_items_computed == 1
    assert pixel_counts(address, roles["gateway"])[0] == before[0][0] + 1


def test_pixel_values_from_callers_not_trusted_are_never_used(stack, roles, reference):
    """A decoder (not trusted with hashes) sends an image's file with the pixel values of
    a blank picture: the rows come from the file, as the answer through the gateway shows;
    without the file it is asked for it."""
    address, fingerprint = stack.address("encoder"), stack.fingerprint("encoder")
    image = noise_image(313, *LARGE_SIDES)
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=image,
        content_hash=decode_image(image).content_hash(fingerprint),
    )
    item.pixel_values.dtype = "float32"
    item.pixel_values.shape[:] = [3, 56, 56]
    item.pixel_values.data = bytes(3 * 56 * 56 * 4)
    request = encoder_pb2.EncodeRequest(items=[item], model_fingerprint=fingerprint)
    before = pixel_counts(address, roles["gateway"])
    with sync_channel(address, roles["decoder"]) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        encoded = stub.Encode(request, timeout=60)
        assert encoded.items[0].source == encoder_pb2.ENCODE_SOURCE_COMPUTED
        assert pixel_counts(address, roles["gateway"]) == (before[0], before[1] + 1)

        request.items[0].data = b""  # the request holds a copy of `item`
        refused = refusal(lambda: stub.Encode(request, timeout=60))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "send the file" in refused.details()

    prompt, done = answer(stack, roles, image)
    assert done.stats.num_items_cached == 1  # the rows the decoder's Encode computed
    expected = reference.generate(prompt, MAX_NEW_TOKENS)
    assert_greedy_match(done.token_ids, expected, "rows of a file sent with other pixels")
