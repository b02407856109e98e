"""Bad input gets INVALID_ARGUMENT or NOT_FOUND with a message that says what is wrong,
and the service keeps serving."""

from __future__ import annotations

import threading

import grpc
import pytest

from tessera.media import decode_image
from tessera.testbed.reference import noise_image
from tessera.v1 import (
    common_pb2,
    decoder_pb2,
    decoder_pb2_grpc,
    encoder_pb2,
    encoder_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
)

IMAGE = noise_image(7, 32, 32)
UNKNOWN_HASH = "ab" * 32


def text(value: str) -> gateway_pb2.ContentPart:
    return gateway_pb2.ContentPart(text=value)


def image(data: bytes) -> gateway_pb2.ContentPart:
    return gateway_pb2.ContentPart(image=data)


def user(*parts: gateway_pb2.ContentPart) -> gateway_pb2.ChatMessage:
    return gateway_pb2.ChatMessage(role="user", content=list(parts))


@pytest.fixture(scope="module")
def gateway(cluster):
    with grpc.insecure_channel(cluster.address("gateway")) as channel:
        yield gateway_pb2_grpc.GatewayServiceStub(channel)


@pytest.fixture(scope="module")
def decoder(cluster):
    with grpc.insecure_channel(cluster.address("decoder")) as channel:
        yield decoder_pb2_grpc.DecoderServiceStub(channel)


@pytest.fixture(scope="module")
def encoder(cluster):
    with grpc.insecure_channel(cluster.address("encoder")) as channel:
        yield encoder_pb2_grpc.EncoderServiceStub(channel)


def generate(gateway, *messages, **sampling) -> list[gateway_pb2.GenerateResponse]:
    request = gateway_pb2.GenerateRequest(
        messages=list(messages), sampling=common_pb2.SamplingParams(max_tokens=3, **sampling)
    )
    return list(gateway.Generate(request, timeout=60))


def assert_still_serving(gateway) -> None:
    responses = generate(gateway, user(image(IMAGE), text("still there?")))
    assert responses[-1].finished.usage.completion_tokens == 3


GATEWAY_CASES = {
    "undecodable image": ((user(image(b"not an image at all"), text("hi")),), {}, "decoded"),
    "empty image": ((user(image(b""), text("hi")),), {}, "empty"),
    "audio to an image model": (
        (user(gateway_pb2.ContentPart(audio=b"RIFF...."), text("hi")),),
        {},
        "takes image input, not audio",
    ),
    "more placeholders than images": ((user(text("look: <image>")),), {}, "placeholders"),
    "more placeholders than images, with an image": (
        (user(image(IMAGE), text("and <image>")),),
        {},
        "2 media placeholders but 1",
    ),
    "prompt longer than the context": ((user(text("word " * 2100)),), {}, "context"),
    "max tokens beyond the context": (
        (user(text("hi")),),
        {"max_tokens": 5000},
        "max_tokens",
    ),
    "no messages": ((), {}, "messages is empty"),
    "unknown role": ((gateway_pb2.ChatMessage(role="robot", content=[text("hi")]),), {}, "role"),
    "empty content part": ((user(gateway_pb2.ContentPart()),), {}, "empty"),
    "message without parts": ((gateway_pb2.ChatMessage(role="user"),), {}, "no content"),
    "negative temperature": ((user(text("hi")),), {"temperature": -1.0}, "temperature"),
    "too many logprobs": ((user(text("hi")),), {"num_top_logprobs": 50}, "logprobs"),
    "nan temperature": ((user(text("hi")),), {"temperature": float("nan")}, "temperature"),
    "text that cannot fit the context": (
        (user(text("word " * 100_000)),),
        {},
        "characters of text",
    ),
}


@pytest.mark.parametrize("case", list(GATEWAY_CASES))
def test_gateway_rejects(gateway, case):
    messages, sampling, phrase = GATEWAY_CASES[case]
    # max_tokens is set by generate(); a case may override it.
    max_tokens = sampling.pop("max_tokens", 3)
    request = gateway_pb2.GenerateRequest(
        messages=list(messages),
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, **sampling),
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(gateway.Generate(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert phrase in caught.value.details()
    assert_still_serving(gateway)


def test_gateway_refuses_an_overlong_request_id(gateway):
    request = gateway_pb2.GenerateRequest(
        request_id="x" * 100_000,
        messages=[user(text("hi"))],
        sampling=common_pb2.SamplingParams(max_tokens=2),
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(gateway.Generate(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 128" in caught.value.details()
    assert_still_serving(gateway)


def test_gateway_refuses_a_decompression_bomb_from_its_header(gateway):
    # 9000 x 9000 = 81 M pixels of one colour: a tiny PNG that would decode to 243 MB.
    bomb = _flat_png(9000, 9000)
    with pytest.raises(grpc.RpcError) as caught:
        generate(gateway, user(image(bomb), text("hi")))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "pixels" in caught.value.details()
    assert_still_serving(gateway)


def test_images_past_the_request_pixel_budget_are_refused_before_decoding(gateway, encoder):
    # Each 7000 x 7000 image is under the 64 M-pixel item limit; three are 147 M pixels,
    # above the 128 M of one request. Sixteen such images once held an encoder for 15 s.
    sizes = [(7000, 7000), (7000, 7001), (7000, 7002)]
    images = [_flat_png(*size) for size in sizes]
    with pytest.raises(grpc.RpcError) as caught:
        generate(gateway, user(*(image(data) for data in images), text("hi")))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-request-pixels" in caught.value.details()
    items = [
        common_pb2.MediaItem(modality=common_pb2.MODALITY_IMAGE, data=data, content_hash=name * 64)
        for data, name in zip(images, "abc", strict=True)
    ]
    with pytest.raises(grpc.RpcError) as caught:
        encoder.Encode(encoder_pb2.EncodeRequest(items=items), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-request-pixels" in caught.value.details()
    assert_still_serving(gateway)


def _flat_png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (width, height)).save(buffer, format="PNG")
    return buffer.getvalue()


def decode_request(prompt: list[int], items=(), **sampling) -> decoder_pb2.DecodeRequest:
    return decoder_pb2.DecodeRequest(
        request_id="bad-input",
        prompt_token_ids=prompt,
        items=list(items),
        sampling=common_pb2.SamplingParams(max_tokens=2, **sampling),
    )


def media_source(encoder_address: str, offset: int, length: int, content_hash: str):
    return decoder_pb2.MediaSource(
        range=common_pb2.PlaceholderRange(
            modality=common_pb2.MODALITY_IMAGE,
            content_hash=content_hash,
            offset=offset,
            length=length,
        ),
        encoder_addresses=[encoder_address],
        data=IMAGE,
    )


def test_decoder_rejects_malformed_requests(cluster, decoder, reference):
    image_id = reference.placeholder_token_id
    address = cluster.address("encoder")
    good_hash = UNKNOWN_HASH
    many_hints = media_source(address, 1, 1, good_hash)
    many_hints.encoder_addresses.extend(f"10.0.{i // 250}.{i % 250}:1" for i in range(100_000))
    cases = {
        "empty prompt": (decode_request([]), "empty"),
        "no request id": (decoder_pb2.DecodeRequest(prompt_token_ids=[1, 2]), "request_id"),
        "token outside the vocabulary": (decode_request([1, 10**6]), "vocabulary"),
        "placeholders without an item": (decode_request([1, image_id, image_id, 5]), "placeholder"),
        "item over ordinary text": (
            decode_request([1, 5, 6, 7], [media_source(address, 1, 2, good_hash)]),
            "not the image placeholder",
        ),
        "item past the prompt": (
            decode_request([1, image_id, image_id], [media_source(address, 1, 5, good_hash)]),
            "past the prompt",
        ),
        "malformed content hash": (
            decode_request([1, image_id, 5], [media_source(address, 1, 1, "xyz")]),
            "content hash",
        ),
        "prompt as long as the context": (decode_request([5] * 2048), "context"),
        "a request id of 100 kB": (
            decoder_pb2.DecodeRequest(request_id="x" * 100_000, prompt_token_ids=[1, 2]),
            "at most 128",
        ),
        "nan top_p": (decode_request([1, 5, 6], top_p=float("nan")), "top_p"),
        "100k encoder hints": (decode_request([1, image_id, 5], [many_hints]), "at most 256"),
    }
    for name, (request, phrase) in cases.items():
        with pytest.raises(grpc.RpcError) as caught:
            list(decoder.Generate(request, timeout=30))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert phrase in caught.value.details(), (name, caught.value.details())
    ok = list(decoder.Generate(decode_request([1, 5, 205, 6]), timeout=30))
    assert ok[-1].finished.usage.completion_tokens == 2


def rows_of(messages) -> int:
    """Rows in a GetEmbeddingSlices or a GetEmbeddingRows stream."""
    total = 0
    for m in messages:
        if isinstance(m, encoder_pb2.EmbeddingSlice):
            total += m.rows.shape[0]
        else:  # EmbeddingRows, as any protobuf reader parses it
            total += len(m.data) // (m.row_width * 4)
    return total


@pytest.mark.parametrize("method", ["GetEmbeddingSlices", "GetEmbeddingRows"])
def test_encoder_slice_errors(encoder, cluster, method):
    """Both ways of reading rows answer, and bound, every caller alike."""
    call = getattr(encoder, method)
    decoded = decode_image(IMAGE)
    fingerprint = cluster.fingerprint()
    content_hash = decoded.content_hash(fingerprint)
    encoded = encoder.Encode(
        encoder_pb2.EncodeRequest(
            items=[
                common_pb2.MediaItem(
                    modality=common_pb2.MODALITY_IMAGE, data=IMAGE, content_hash=content_hash
                )
            ]
        )
    )
    num_rows = encoded.items[0].num_rows

    def slices(content_hash: str, start: int, end: int):
        request = encoder_pb2.GetEmbeddingSlicesRequest(
            slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=start, end=end)]
        )
        return list(call(request, timeout=30))

    with pytest.raises(grpc.RpcError) as caught:
        slices(UNKNOWN_HASH, 0, 1)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Encode it first" in caught.value.details()
    for start, end, phrase in [(0, num_rows + 1, "outside item"), (3, 3, "empty"), (5, 2, "empty")]:
        with pytest.raises(grpc.RpcError) as caught:
            slices(content_hash, start, end)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert phrase in caught.value.details()
    rows = slices(content_hash, 2, num_rows)
    assert rows_of(rows) == num_rows - 2
    # A caller whose range is half the item's length is refused, not served a prefix.
    half = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[
            encoder_pb2.RowSlice(
                content_hash=content_hash, start=0, end=2, item_num_rows=num_rows // 2
            )
        ]
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(call(half, timeout=30))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"has {num_rows} rows; the request's range says {num_rows // 2}" in (
        caught.value.details()
    )

    # A hostile caller: pins for good, or one call that copies the item 100k times.
    forever = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=0, end=num_rows)],
        lease_owner="someone",
        lease_ms=4294967295,
    )
    many = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=0, end=num_rows)] * 100_000
    )
    long_owner = encoder_pb2.GetEmbeddingSlicesRequest(
        slices=[encoder_pb2.RowSlice(content_hash=content_hash, start=0, end=num_rows)],
        lease_owner="x" * 100_000,
    )
    for request, phrase in [
        (forever, "--max-lease-ms"),
        (many, "--max-slices-per-call"),
        (long_owner, "at most 128"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            list(call(request, timeout=30))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert phrase in caught.value.details()


def test_encoder_rejects_bad_items(encoder):
    def encode(data: bytes, content_hash: str, modality=common_pb2.MODALITY_IMAGE):
        item = common_pb2.MediaItem(modality=modality, data=data, content_hash=content_hash)
        return encoder.Encode(encoder_pb2.EncodeRequest(items=[item]), timeout=30)

    for data, content_hash, modality, phrase in [
        (IMAGE, UNKNOWN_HASH, common_pb2.MODALITY_IMAGE, "does not match"),
        (b"garbage", UNKNOWN_HASH, common_pb2.MODALITY_IMAGE, "decoded"),
        (IMAGE, "short", common_pb2.MODALITY_IMAGE, "content hash"),
        (IMAGE, UNKNOWN_HASH, common_pb2.MODALITY_AUDIO, "audio"),
        (IMAGE, UNKNOWN_HASH, common_pb2.MODALITY_UNSPECIFIED, "modality"),
    ]:
        with pytest.raises(grpc.RpcError) as caught:
            encode(data, content_hash, modality)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert phrase in caught.value.details(), caught.value.details()
    stats = encoder.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
    assert stats.num_items_requested > 0


def test_one_request_id_twice_at_once_is_two_requests(cluster):
    """A proxy retrying with the client's id used to get 400 "already running": the id
    was the decoder's key. Now it is a label and both run."""
    request = gateway_pb2.GenerateRequest(
        request_id="same-id",
        messages=[user(text("Tell a long story about the sea."))],
        sampling=common_pb2.SamplingParams(max_tokens=40, ignore_eos=True),
    )
    results: list[list[int]] = []
    errors: list[BaseException] = []
    both_started = threading.Barrier(2)

    def run() -> None:
        try:
            with grpc.insecure_channel(cluster.address("gateway")) as channel:
                stub = gateway_pb2_grpc.GatewayServiceStub(channel)
                tokens: list[int] = []
                for response in stub.Generate(request, timeout=120):
                    if response.HasField("delta") and response.delta.token_ids:
                        if not tokens:
                            both_started.wait(60)  # both are decoding at once
                        tokens += response.delta.token_ids
                results.append(tokens)
        except BaseException as error:
            errors.append(error)
            both_started.abort()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    assert len(results) == 2 and results[0] == results[1] and len(results[0]) == 40
