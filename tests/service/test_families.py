"""Every model family through the real services: greedy output equals the checkpoint's own
`generate()` (fed the processor's own inputs for the same chat messages), over gRPC and
HTTP (the real `openai` client), with 1-3 images of different sizes and aspect ratios or
1-3 audio clips of different lengths, rates, channel counts and containers, at chunk
sizes 16, 64 and unchunked; a repeated request comes from the prefix cache; 8 mixed requests run
concurrently; bad layouts sent straight to the decoder are refused.

One stack (encoder, decoder, gateway with HTTP) per family, started once for all of the
family's cases.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import openai
import pytest

from gateway.prompt import Prompt, PromptBuilder
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.client import Audio, Client, Message
from tessera.demo_models import AUDIO_DEMO_FAMILIES, DEMO_FAMILIES, make_demo_model
from tessera.launcher import free_port
from tessera.media_decoder import MediaLimits
from tessera.testbed.audio_files import sound_file, tone, wav_clip
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import (
    Reference,
    ReferenceOutput,
    assert_greedy_match,
    noise_image,
    to_chat_inputs,
)
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc
from tessera.wire import range_to_proto

MAX_NEW_TOKENS = 8
# The stacks' media limits: every image below is smaller, every clip shorter; Voxtral
# takes clips of several 30 s windows, Qwen2-Audio caps them at its one window.
MAX_IMAGE_PIXELS = 20_000
MAX_AUDIO_SECONDS = 45.0
CHUNK_SIZES = [16, 64, 0]  # 0: unchunked (the decoder's limit, above every prompt here)

# Items of every size the tests need, per modality: images of different sizes and aspect
# ratios; clips of different lengths, rates, channel counts and containers.
IMAGES = {
    "wide": noise_image(11, 90, 40),
    "tall": noise_image(12, 35, 70),
    "small": noise_image(13, 60, 45),
    "large": noise_image(14, 130, 100),
}
CLIPS = {
    "wide": wav_clip(11, 2.5),
    "tall": wav_clip(12, 1.2, rate=44_100, channels=2),
    "small": Audio(sound_file(tone(13, 0.9, 22_050), 22_050, "FLAC")),
    "large": wav_clip(14, 4.0, rate=8_000),
}


# Families that also take video (tests/service/test_video.py).
VIDEO_FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe")

# Mistral's tokenizer refuses a system prompt in a conversation with audio.
NO_SYSTEM_PROMPT_WITH_MEDIA = ("voxtral",)


def prompts(items: dict, system: bool = True) -> dict[str, list]:
    wide, tall, small, large = items["wide"], items["tall"], items["small"], items["large"]
    system_prompt = [("system", ["You are a careful assistant."])] if system else []
    return {
        "one-item": [("user", [small, "What is in this picture?"])],
        "two-items": [*system_prompt, ("user", [wide, "and", tall, "compare them"])],
        "three-items": [("user", [tall, "first", large, "then", wide, "which is widest?"])],
    }


@dataclass
class FamilyStack:
    name: str
    model_dir: Path
    cluster: Cluster
    http_port: int
    reference: Reference
    items: dict  # IMAGES or CLIPS: what this family takes
    expected: dict[str, ReferenceOutput]
    builder: PromptBuilder  # the gateway's own prompt code, in this process

    @property
    def gateway(self) -> str:
        return self.cluster.address("gateway")

    @property
    def prompts(self) -> dict[str, list]:
        return prompts(self.items, system=self.name not in NO_SYSTEM_PROMPT_WITH_MEDIA)


@pytest.fixture(scope="module", params=list(DEMO_FAMILIES))
def stack(request, tmp_path_factory, run_on) -> FamilyStack:
    name = request.param
    model_dir = make_demo_model(tmp_path_factory.mktemp(name) / "tiny", family=name, seed=0)
    model = ["--model", str(model_dir), *run_on.service_args()]
    items = CLIPS if name in AUDIO_DEMO_FAMILIES else IMAGES
    cluster = Cluster()
    http_port = free_port()
    try:
        limits = ["--max-image-pixels", str(MAX_IMAGE_PIXELS)]
        limits += ["--max-audio-seconds", str(MAX_AUDIO_SECONDS)]
        encoder = cluster.start("encoder", "encoder", [*model, *limits])
        decoder = cluster.start("decoder", "decoder", [*model, "--encoders", encoder])
        routes = ["--encoders", encoder, "--decoders", decoder, "--http-port", str(http_port)]
        cluster.start("gateway", "gateway", [*model, *limits, *routes])
        reference = Reference(model_dir, run_on)
        system = name not in NO_SYSTEM_PROMPT_WITH_MEDIA
        expected = {
            key: reference.generate(p, MAX_NEW_TOKENS) for key, p in prompts(items, system).items()
        }
        builder = PromptBuilder(
            load_family(str(model_dir), LoadOptions(ModelPart.PROCESSOR)),
            MediaLimits(MAX_IMAGE_PIXELS, MAX_AUDIO_SECONDS),
            16,
        )
        cluster.wait_ready()
        yield FamilyStack(name, model_dir, cluster, http_port, reference, items, expected, builder)
    finally:
        cluster.stop()


def greedy() -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)


def messages(prompt) -> list[Message]:
    return [Message(role, parts) for role, parts in prompt]


@pytest.mark.parametrize("chunk", CHUNK_SIZES, ids=lambda c: f"chunk{c or '-all'}")
@pytest.mark.parametrize("prompt", list(prompts(IMAGES)))
def test_greedy_tokens_equal_generate(stack, prompt, chunk):
    expected = stack.expected[prompt]
    with Client(stack.gateway) as client:
        done = client.complete(
            messages(stack.prompts[prompt]), greedy(), chunk, cache_salt=f"{prompt}-{chunk}"
        )
    assert done.prompt_token_ids == expected.prompt_token_ids, "prompt ids = the processor's"
    assert_greedy_match(done.token_ids, expected, f"{stack.name} {prompt} chunk {chunk}")

    chunks = done.stats.decoder.chunks
    assert chunks[0].start == 0 and chunks[-1].end == len(expected.prompt_token_ids)
    placeholder = stack.reference.placeholder_token_id
    items = [(i.range.offset, i.range.end) for i in gateway_prompt(stack, prompt).items]
    for c in chunks:
        # The minimum: one row (of every plane) per placeholder position in the chunk.
        rows = expected.prompt_token_ids[c.start : c.end].count(placeholder)
        assert c.num_embedding_rows == rows
        assert c.num_embedding_bytes == rows * stack.reference.row_bytes
        if stack.name == "gemma3":  # bidirectional images: no chunk may cut one
            for start, end in items:
                assert not (c.start < start < c.end < end), (c, start, end)
                assert not (start < c.start < end), (c, start, end)
    if chunk and stack.name != "gemma3":
        assert [c.start for c in chunks] == list(range(0, chunks[-1].end, chunk))


def gateway_prompt(stack: FamilyStack, prompt: str | list) -> Prompt:
    """The prompt the gateway builds for `prompt`, by the gateway's own code."""
    return stack.builder.build(
        to_chat_inputs(stack.prompts[prompt] if isinstance(prompt, str) else prompt)
    )


def test_http_api_gives_the_same_tokens(stack):
    """Through the real `openai` client: images as image_url data URLs, audio as OpenAI's
    input_audio and vLLM's audio_url."""
    # The second item goes as a URL part (images are URLs anyway).
    chat = [
        {
            "role": role,
            "content": [_openai_part(part, as_url=part is stack.items["tall"]) for part in parts],
        }
        for role, parts in stack.prompts["two-items"]
    ]
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1", api_key="unused", max_retries=0
    )
    answer = client.chat.completions.create(
        model="",
        messages=chat,
        max_tokens=MAX_NEW_TOKENS,
        temperature=0,
        extra_body={"max_chunk_tokens": 16, "cache_salt": "http"},
        timeout=120,
    )
    tokens = answer.model_extra["tessera"]["token_ids"]
    assert_greedy_match(tokens, stack.expected["two-items"], f"{stack.name} http")


def _openai_part(part, as_url: bool = False) -> dict:
    """A content part in the OpenAI shape; `as_url`: audio as vLLM's audio_url data URL."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if isinstance(part, Audio) and as_url:
        url = "data:audio/wav;base64," + base64.b64encode(part.data).decode()
        return {"type": "audio_url", "audio_url": {"url": url}}
    if isinstance(part, Audio):
        data = base64.b64encode(part.data).decode()
        audio_format = "flac" if part.data.startswith(b"fLaC") else "wav"
        return {"type": "input_audio", "input_audio": {"data": data, "format": audio_format}}
    url = "data:image/png;base64," + base64.b64encode(part).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def test_processing_options_change_rows_and_cache_entries(stack):
    """Qwen-VL's max_pixels (vLLM's mm_processor_kwargs) changes an image's rows: the
    output still equals generate() with the same processor setting, and the setting gets
    a cache entry of its own. Families without options refuse them."""
    prompt = [("user", [stack.items["large"], "What is in this picture?"])]
    takes_pixel_options = stack.name.startswith("qwen") and stack.items is IMAGES
    if not takes_pixel_options:
        with Client(stack.gateway) as client, pytest.raises(grpc.RpcError) as refused:
            client.complete(messages(prompt), greedy(), mm_processor_kwargs={"max_pixels": 1})
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_pixels" in refused.value.details()
        return
    image_processor = stack.reference.processor.image_processor
    unit = (image_processor.patch_size * image_processor.merge_size) ** 2
    options = {"max_pixels": 6 * unit}
    size = {"shortest_edge": image_processor.size["shortest_edge"], "longest_edge": 6 * unit}
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS, size=size)
    default = stack.reference.generate(prompt, MAX_NEW_TOKENS)
    assert len(expected.prompt_token_ids) < len(default.prompt_token_ids), "fewer rows"
    with Client(stack.gateway) as client:
        client.complete(messages(prompt), greedy(), cache_salt="options")  # the default entry
        before = encoder_stats(stack).num_items_computed
        first = client.complete(
            messages(prompt), greedy(), cache_salt="options", mm_processor_kwargs=options
        )
        again = client.complete(
            messages(prompt), greedy(), cache_salt="options", mm_processor_kwargs=options
        )
    assert first.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(first.token_ids, expected, f"{stack.name} max_pixels")
    # Read off the encoder: the decoder's first fetch may beat the gateway's Encode and
    # send its own, which the gateway's then joins (the gateway counts that as cached).
    computed = encoder_stats(stack).num_items_computed - before
    assert computed == 1, "another setting is another cache entry"
    assert again.stats.num_items_computed == 0 and again.token_ids == first.token_ids


def test_http_refuses_malformed_processing_options(stack):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "mm_processor_kwargs": {"max_pixels": "large"},
    }
    url = f"http://127.0.0.1:{stack.http_port}/v1/chat/completions"
    answer = httpx.post(url, json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "mm_processor_kwargs"


def test_repeated_request_comes_from_the_prefix_cache(stack):
    # Text after the image fills whole KV blocks, so every image row is in a cached block.
    prompt = [
        ("user", [stack.items["small"], "Describe every part of this picture in careful detail."])
    ]
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS)
    with Client(stack.gateway) as client:
        first = client.complete(messages(prompt), greedy(), 16, cache_salt="repeat")
        before = encoder_stats(stack)
        again = client.complete(messages(prompt), greedy(), 16, cache_salt="repeat")
    after = encoder_stats(stack)
    for done in (first, again):
        assert_greedy_match(done.token_ids, expected, f"{stack.name} repeated")
    image_end = max(item.range.end for item in gateway_prompt(stack, prompt).items)
    assert again.stats.decoder.num_cached_prompt_tokens >= image_end
    assert again.stats.num_embedding_bytes == 0, "no embedding rows for cached positions"
    assert again.stats.num_items_computed == 0
    assert after.num_items_computed == before.num_items_computed, "no encoder pass"
    assert after.num_bytes_served == before.num_bytes_served


def test_eight_mixed_requests_at_once(stack):
    cases = [(prompt, chunk) for prompt in stack.prompts for chunk in (16, 0)][:6]
    cases += [("one-item", 64), ("text-only", 16)]
    text_only = [("user", ["Say something about the weather today."])]
    expected = dict(stack.expected)
    expected["text-only"] = stack.reference.generate(text_only, MAX_NEW_TOKENS)
    results: dict[int, object] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(cases))

    def send(index: int, prompt: str, chunk: int) -> None:
        try:
            with Client(stack.gateway) as client:
                start.wait(30)
                results[index] = client.complete(
                    messages(stack.prompts.get(prompt, text_only)),
                    greedy(),
                    chunk,
                    cache_salt="mix",
                )
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=send, args=(i, *case)) for i, case in enumerate(cases)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    for index, (prompt, chunk) in enumerate(cases):
        case = f"{stack.name} concurrent {prompt} chunk {chunk}"
        assert results[index].prompt_token_ids == expected[prompt].prompt_token_ids
        assert_greedy_match(results[index].token_ids, expected[prompt], case)


def valid_decode_request(stack: FamilyStack, prompt: str) -> decoder_pb2.DecodeRequest:
    """The DecodeRequest the gateway would send, built by the gateway's own code."""
    built = gateway_prompt(stack, prompt)
    return decoder_pb2.DecodeRequest(
        request_id=f"direct-{prompt}",
        prompt_token_ids=built.token_ids,
        items=[
            decoder_pb2.MediaSource(
                range=range_to_proto(item.range),
                encoder_addresses=[stack.cluster.address("encoder")],
                data=item.data,
                processing_options=item.options.as_dict(),
            )
            for item in built.items
        ],
        sampling=greedy(),
        max_chunk_tokens=16,
    )


def bad_layouts(request: decoder_pb2.DecodeRequest) -> dict[str, decoder_pb2.DecodeRequest]:
    """Copies of `request` whose first item's layout does not fit its length or the model."""
    variants = {}
    layout = request.items[0].range.layout
    grid = list(layout.grid_thw)
    if grid:  # rows != t * h * w / merge^2
        variants["grid"] = [grid[0], grid[1], grid[2] + 2 * (layout.spatial_merge_size or 1)]
    else:  # a grid for a family whose rows have none
        variants["grid"] = [1, 4, 4]
    variants["merge"] = None
    variants["planes"] = None
    out = {}
    for name, new_grid in variants.items():
        bad = decoder_pb2.DecodeRequest()
        bad.CopyFrom(request)
        bad.request_id += f"-bad-{name}"
        target = bad.items[0].range.layout
        if name == "grid":
            del target.grid_thw[:]
            target.grid_thw.extend(new_grid)
        elif name == "merge":
            target.spatial_merge_size = (layout.spatial_merge_size or 1) + 1
        else:
            target.num_planes = (layout.num_planes or 1) + 1
        out[name] = bad
    return out


def test_bad_layouts_are_refused_and_the_decoder_keeps_serving(stack):
    good = valid_decode_request(stack, "two-items")
    with grpc.insecure_channel(stack.cluster.address("decoder")) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        for name, bad in bad_layouts(good).items():
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Generate(bad, timeout=60))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert "item at offset" in refused.value.details(), refused.value.details()
        responses = list(stub.Generate(good, timeout=120))
    tokens = [t for r in responses if r.HasField("tokens") for t in r.tokens.token_ids]
    assert_greedy_match(tokens, stack.expected["two-items"], f"{stack.name} direct")


def encoder_stats(stack: FamilyStack) -> encoder_pb2.EncoderStats:
    with grpc.insecure_channel(stack.cluster.address("encoder")) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def test_models_and_the_cli_take_the_family_media(stack, tmp_path):
    """/v1/models says what the model takes; `tessera generate --image/--audio FILE`
    sends it and prints what generate() gives."""
    models = httpx.get(f"http://127.0.0.1:{stack.http_port}/v1/models", timeout=30).json()
    modality = "audio" if stack.items is CLIPS else "image"
    video = ["video"] if stack.name in VIDEO_FAMILIES else []  # tests/service/test_video.py
    assert models["data"][0]["input_modalities"] == ["text", modality, *video]

    prompt = stack.prompts["one-item"]
    item, text = prompt[0][1]
    path = tmp_path / "item"
    path.write_bytes(item.data if isinstance(item, Audio) else item)
    result = subprocess.run(
        [sys.executable, "-m", "tessera.cli", "generate", "--server", stack.gateway,
         f"--{modality}", str(path), "--max-tokens", str(MAX_NEW_TOKENS), "--json", text],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    expected = stack.expected["one-item"]
    assert printed["prompt_token_ids"] == expected.prompt_token_ids
    assert_greedy_match(printed["token_ids"], expected, f"{stack.name} cli")


def bad_items(stack: FamilyStack) -> dict[str, tuple[bytes, str]]:
    """Unusable items of the family's modality -> a fragment of the error that must say so."""
    if stack.items is IMAGES:
        png = IMAGES["small"]
        return {
            "garbage": (b"not an image at all" * 20, "could not be decoded"),
            "truncated": (png[: len(png) // 2], "could not be decoded"),
        }
    silence = np.zeros((0, 1), np.float32)
    limit = stack.builder.decoder.max_audio_seconds
    too_short = {}
    if stack.name == "qwen2-audio":  # under 2 mel frames it has no rows (Voxtral pads)
        too_short["too-short"] = (sound_file(tone(1, 0.005, 16_000), 16_000), "needs at least")
    return {
        **too_short,
        "not-audio": (IMAGES["small"], "no audio stream"),
        "garbage": (b"not audio at all" * 20, "could not be decoded"),
        "truncated": (CLIPS["wide"].data[:-1000], "truncated"),
        "no-samples": (sound_file(silence, 16_000), "no samples"),
        "too-long": (
            sound_file(tone(1, limit + 1, 8_000), 8_000),
            f"above the limit of {limit:g} s",
        ),
        "8-hours": (_flac_declaring(8 * 3600), "28800.0 s long, above the limit"),
        "rate-1-hz": (sound_file(tone(1, 20.0, 1), 1), "sampling rate is 1 Hz"),
    }


def _flac_declaring(seconds: int, rate: int = 8_000) -> bytes:
    """A short FLAC whose STREAMINFO claims `seconds` of audio: refused from the header,
    before a sample is decoded. STREAMINFO's 64 bits at byte 18 hold the sample rate (20),
    channels - 1 (3), bits per sample - 1 (5) and the total samples (36)."""
    data = bytearray(sound_file(tone(2, 0.5, rate), rate, "FLAC"))
    fields = int.from_bytes(data[18:26], "big")
    fields = (fields & ~((1 << 36) - 1)) | (seconds * rate)
    data[18:26] = fields.to_bytes(8, "big")
    return bytes(data)


def test_bad_items_are_refused_and_the_next_request_is_served(stack):
    """Each bad item: INVALID_ARGUMENT over gRPC and 400 over HTTP, with what to fix; the
    services stay healthy and the next good request gets generate()'s tokens."""
    url = f"http://127.0.0.1:{stack.http_port}/v1/chat/completions"
    with Client(stack.gateway) as client:
        for name, (data, fragment) in bad_items(stack).items():
            item = Audio(data) if stack.items is CLIPS else data
            with pytest.raises(grpc.RpcError) as refused:
                client.complete([Message("user", [item, "What is it?"])], greedy())
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert fragment in refused.value.details(), (name, refused.value.details())
            body = {"messages": [{"role": "user", "content": [_openai_part(item)]}]}
            answer = httpx.post(url, json=body, timeout=60)
            assert answer.status_code == 400, (name, answer.text)
            assert fragment in answer.json()["error"]["message"], name
        if stack.name in NO_SYSTEM_PROMPT_WITH_MEDIA:
            with pytest.raises(grpc.RpcError) as refused:
                prompt = [("system", ["Be brief."]), *stack.prompts["one-item"]]
                client.complete(messages(prompt), greedy())
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "chat template refused" in refused.value.details()
        done = client.complete(messages(stack.prompts["one-item"]), greedy(), cache_salt="after")
    assert_greedy_match(done.token_ids, stack.expected["one-item"], f"{stack.name} after bad")


def test_the_largest_item_the_limits_allow_is_served_and_one_above_refused(stack):
    """At the limit: generate()'s tokens (a Voxtral clip of two 30 s windows, a full
    Qwen2-Audio window); just above it: INVALID_ARGUMENT naming the limit."""
    if stack.items is CLIPS:
        seconds = stack.builder.decoder.max_audio_seconds  # the family may cap the flag
        largest = Audio(sound_file(tone(41, seconds, 16_000), 16_000))
        above = Audio(sound_file(tone(41, seconds + 1, 16_000), 16_000))
        limit = f"above the limit of {seconds:g} s"
    else:
        largest, above = noise_image(41, 200, 100), noise_image(41, 201, 100)
        limit = f"above the limit of {MAX_IMAGE_PIXELS}"
    prompt = [("user", [largest, "Describe it."])]
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS)
    with Client(stack.gateway) as client:
        done = client.complete(messages(prompt), greedy(), 64, cache_salt="largest")
        with pytest.raises(grpc.RpcError) as refused:
            client.complete([Message("user", [above, "Describe it."])], greedy())
    assert done.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(done.token_ids, expected, f"{stack.name} largest item")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert limit in refused.value.details(), refused.value.details()
