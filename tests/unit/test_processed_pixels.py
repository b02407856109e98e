"""Images a gateway processed: which families and images qualify, rows from pixel values
equal to rows from the file (real demo checkpoints), what the encoder takes from whom,
and the gateway sending files to an encoder that asks for them (real gRPC on loopback)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import torch

from encoder_service.items import EncodeItem, EncoderCounters, InvalidItemError
from encoder_service.processed_pixels import FilesWantedError, pixels_of
from gateway.encode_dispatch import encode_at
from gateway.processed_pixels import PixelValues, worth_sending
from tessera.adapters import LoadOptions, MediaInput, ModelPart, load_family
from tessera.adapters.base import ProcessedImage
from tessera.demo_models import make_demo_model
from tessera.media import decode_image
from tessera.placeholders import Modality
from tessera.testbed.audio_files import wav_clip
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2, encoder_pb2
from tessera.wire import FILES_WANTED_KEY
from tests.unit.test_encode_announced import encode_request, serving
from tests.unit.test_encoder_core import HeldFamily

# The tiny demo processors make (3, 56, 56) float32: 37,632 bytes, the pixels of a
# 112 x 112 RGB picture.
LARGE, SMALL = noise_image(21, 130, 100), noise_image(22, 100, 100)


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, object]:
    """Every demo family's processor and media tower."""
    root = tmp_path_factory.mktemp("families")
    options = LoadOptions(ModelPart.PROCESSOR | ModelPart.MEDIA_ENCODER)
    return {
        name: load_family(str(make_demo_model(Path(root) / name, name)), options)
        for name in ("llava", "gemma3", "qwen2-vl", "llava-onevision", "qwen2-audio")
    }


def test_only_fixed_shape_image_families_take_processed_pixels(families):
    shapes = {name: family.processed_pixels_shape for name, family in families.items()}
    assert shapes == {
        "llava": (3, 56, 56),
        "gemma3": (3, 56, 56),
        "qwen2-vl": None,  # the processor's output grows with the image
        "llava-onevision": None,
        "qwen2-audio": None,
    }


def test_an_image_is_worth_sending_processed_only_when_that_is_smaller(families):
    llava, qwen = families["llava"], families["qwen2-vl"]
    assert worth_sending(llava, decode_image(LARGE))  # 39,000 bytes of pixels
    assert not worth_sending(llava, decode_image(SMALL))  # 30,000
    assert not worth_sending(qwen, decode_image(LARGE))
    clip = families["qwen2-audio"]
    assert not worth_sending(clip, object())  # not an image


@pytest.mark.parametrize("name", ["llava", "gemma3"])
def test_rows_from_processed_pixels_equal_rows_from_the_file(families, name):
    """Bit for bit, also when processed and decoded images share one forward."""
    family = families[name]
    images = [decode_image(noise_image(30 + k, 90 + 40 * k, 140 - 30 * k)) for k in range(3)]
    from_files = family.encode([MediaInput(image) for image in images])
    mixed = [
        MediaInput(image) if k == 1 else MediaInput(ProcessedImage(family.process_image(image)))
        for k, image in enumerate(images)
    ]
    for expected, rows in zip(from_files, family.encode(mixed), strict=True):
        assert torch.equal(rows, expected)


def test_the_gateway_hashes_as_ever_and_processes_only_when_enabled(families):
    family = families["llava"]
    image = decode_image(LARGE)
    name = image.content_hash(family.fingerprint)
    sent = PixelValues(family, enabled=True).hash_and_pixels(image, lambda: name)
    assert sent[0] == name
    assert torch.equal(sent[1], family.process_image(image))
    assert PixelValues(family, enabled=False).hash_and_pixels(image, lambda: name) == (name, None)
    small = decode_image(SMALL)
    assert PixelValues(family, enabled=True).hash_and_pixels(small, lambda: "h") == ("h", None)


def pixel_item(data: bytes = b"", shape=(3, 4, 4), dtype: str = "float32") -> common_pb2.MediaItem:
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE, data=data, content_hash="a" * 64
    )
    item.pixel_values.dtype = dtype
    item.pixel_values.shape[:] = shape
    item.pixel_values.data = torch.arange(48, dtype=torch.float32).numpy().tobytes()
    return item


def test_the_encoder_takes_pixel_values_only_from_a_trusted_caller():
    counters = EncoderCounters()
    # Trusted: used as sent.
    pixels = pixels_of(pixel_item(), True, (3, 4, 4), counters)
    assert torch.equal(pixels, torch.arange(48, dtype=torch.float32).view(3, 4, 4))
    # Not trusted, beside a file: ignored (the file is decoded), and counted.
    assert pixels_of(pixel_item(data=SMALL), False, (3, 4, 4), counters) is None
    assert counters.num_pixel_values_ignored == 1
    # Not trusted, in place of a file: the files are asked for.
    with pytest.raises(FilesWantedError, match="send the file"):
        pixels_of(pixel_item(), False, (3, 4, 4), counters)
    # No pixel values: the file, whoever sends it.
    plain = common_pb2.MediaItem(modality=common_pb2.MODALITY_IMAGE, data=SMALL)
    assert pixels_of(plain, True, (3, 4, 4), counters) is None
    # An EncodeItem cannot carry pixel values its caller is not trusted with.
    with pytest.raises(ValueError, match="trusted"):
        EncodeItem("a" * 64, Modality.IMAGE, b"", pixel_values=pixels)


@pytest.mark.parametrize(
    "item, expected_shape, message",
    [
        (pixel_item(shape=(3, 4, 5)), (3, 4, 4), r"shape \[3, 4, 5\]; this model's .* \[3, 4, 4\]"),
        (pixel_item(dtype="float16"), (3, 4, 4), "must be float32"),
        (
            pixel_item(shape=(3, 2, 4)),
            (3, 2, 4),
            r"192 bytes .* needs 96",
        ),
        (pixel_item(), None, "makes no fixed shape"),
    ],
)
def test_pixel_values_a_trusted_caller_cannot_have_meant_are_refused(item, expected_shape, message):
    with pytest.raises(InvalidItemError, match=message):
        pixels_of(item, True, expected_shape, EncoderCounters())


def test_pixel_values_on_audio_are_refused():
    item = pixel_item()
    item.modality = common_pb2.MODALITY_AUDIO
    item.data = wav_clip(1, 0.5).data
    with pytest.raises(InvalidItemError, match="images only"):
        pixels_of(item, True, (3, 4, 4), EncoderCounters())


def test_an_encoder_that_does_not_trust_the_gateway_gets_the_files_instead():
    """Plaintext: the encoder trusts nobody, so it refuses pixel values without a file and
    asks for the files; the gateway sends them at once, and from then on only them."""

    async def scenario() -> None:
        family = HeldFamily()
        family.release.set()
        server, address = await serving(family)
        with_files = encode_request([41])
        requests: list[bool] = []

        def request_for(with_pixels: bool) -> encoder_pb2.EncodeRequest:
            requests.append(with_pixels)
            if not with_pixels:
                return with_files
            request = encoder_pb2.EncodeRequest()
            request.CopyFrom(with_files)
            request.items[0].data = b""
            request.items[0].pixel_values.CopyFrom(pixel_item().pixel_values)
            return request

        files_wanted: set[str] = set()
        announced: list[bool] = []
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                args = (channel, address, request_for, 30, lambda: announced.append(True))
                first = await encode_at(*args, files_wanted)
                second = await encode_at(*args, files_wanted)
        finally:
            await server.stop(None)
        assert requests == [True, False, False]
        assert files_wanted == {address}
        assert announced == [True, True]  # once per answered call, not for the refusal
        assert first.items[0].source == encoder_pb2.ENCODE_SOURCE_COMPUTED
        assert second.items[0].source == encoder_pb2.ENCODE_SOURCE_MEMORY

    asyncio.run(scenario())


def test_the_refusal_names_itself_in_trailing_metadata():
    async def scenario() -> grpc.aio.AioRpcError:
        server, address = await serving(HeldFamily())
        request = encode_request([42])
        request.items[0].data = b""
        request.items[0].pixel_values.CopyFrom(pixel_item().pixel_values)
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                method = channel.unary_unary(
                    "/tessera.v1.EncoderService/Encode",
                    request_serializer=encoder_pb2.EncodeRequest.SerializeToString,
                    response_deserializer=encoder_pb2.EncodeResponse.FromString,
                )
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await method(request, timeout=30)
        finally:
            await server.stop(None)
        return raised.value

    error = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (FILES_WANTED_KEY, "1") in tuple(error.trailing_metadata())
    assert "send the file" in error.details()
