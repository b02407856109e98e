"""Video through the real services for Qwen2.5-VL and Qwen3-VL: greedy output equals the
checkpoint's own `generate()` (fed frames that a plain PyAV loop decoded and the video
processor's own `sample_frames` picked) for 1-2 videos and a video beside an image, at
chunk sizes 64 and 256 that cut the videos; each chunk receives exactly its own rows; a
repeat comes from the prefix cache; sampling options change the rows and the cache entry;
`video_url` over HTTP gives the same tokens; bad videos are refused with what to fix and
the services keep serving.

One stack (encoder, decoder, gateway with HTTP) per family, started once for its cases.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from gateway.prompt import PromptBuilder
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.client import Client, Message, Video
from tessera.demo_models import make_demo_model
from tessera.launcher import free_port
from tessera.media_decoder import MediaLimits
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import (
    Reference,
    ReferenceOutput,
    assert_greedy_match,
    noise_image,
    to_chat_inputs,
)
from tessera.testbed.video_files import claiming_frame_size, make_video, no_frames
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc
from tessera.video import VideoLimits
from tessera.wire import range_to_proto

FAMILIES = ["qwen2.5-vl", "qwen3-vl"]
MAX_NEW_TOKENS = 8
CHUNK_SIZES = [64, 256]
MAX_VIDEO_SECONDS = 60.0

# At 2 frames per second: "long" samples 32 of its 64 frames (256 rows in both families,
# more than either chunk size), "wide" 8 frames of another aspect ratio in WebM, "short"
# 4 frames in Matroska.
VIDEOS = {
    "long": Video(make_video(64, 4.0, 112, 112, "mp4", seed=1)),
    "wide": Video(make_video(20, 5.0, 128, 96, "webm", seed=2)),
    "short": Video(make_video(10, 5.0, 80, 64, "mkv", seed=3)),
}
IMAGE = noise_image(21, 90, 60)
PROMPTS = {
    "one-video": [
        ("system", ["You are a careful assistant."]),
        ("user", [VIDEOS["long"], "What happens in this video?"]),
    ],
    "two-videos": [("user", [VIDEOS["wide"], "and", VIDEOS["short"], "which is longer?"])],
    "video-and-image": [("user", [VIDEOS["short"], "then", IMAGE, "describe both"])],
}


@dataclass
class VideoStack:
    name: str
    model_dir: Path
    cluster: Cluster
    http_port: int
    reference: Reference
    expected: dict[str, ReferenceOutput]
    builder: PromptBuilder

    @property
    def gateway(self) -> str:
        return self.cluster.address("gateway")

    def media_token_ids(self) -> set[int]:
        config = self.reference.model.config
        return {config.image_token_id, config.video_token_id}


@pytest.fixture(scope="module", params=FAMILIES)
def stack(request, tmp_path_factory, run_on) -> VideoStack:
    name = request.param
    model_dir = make_demo_model(tmp_path_factory.mktemp(name) / "tiny", family=name, seed=0)
    model = ["--model", str(model_dir), *run_on.service_args()]
    limits = ["--max-video-seconds", str(MAX_VIDEO_SECONDS)]
    cluster = Cluster()
    http_port = free_port()
    try:
        encoder = cluster.start("encoder", "encoder", [*model, *limits])
        decoder = cluster.start("decoder", "decoder", [*model, "--encoders", encoder])
        routes = ["--encoders", encoder, "--decoders", decoder, "--http-port", str(http_port)]
        cluster.start("gateway", "gateway", [*model, *limits, *routes])
        reference = Reference(model_dir, run_on)
        expected = {key: reference.generate(p, MAX_NEW_TOKENS) for key, p in PROMPTS.items()}
        builder = PromptBuilder(
            load_family(str(model_dir), LoadOptions(ModelPart.PROCESSOR)),
            MediaLimits(video=VideoLimits(max_seconds=MAX_VIDEO_SECONDS)),
            16,
        )
        cluster.wait_ready()
        yield VideoStack(name, model_dir, cluster, http_port, reference, expected, builder)
    finally:
        cluster.stop()


def greedy() -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)


def messages(prompt) -> list[Message]:
    return [Message(role, parts) for role, parts in prompt]


def encoder_stats(stack: VideoStack) -> encoder_pb2.EncoderStats:
    with grpc.insecure_channel(stack.cluster.address("encoder")) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


@pytest.mark.parametrize("chunk", CHUNK_SIZES, ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_greedy_tokens_equal_generate(stack, prompt, chunk):
    expected = stack.expected[prompt]
    with Client(stack.gateway) as client:
        done = client.complete(
            messages(PROMPTS[prompt]), greedy(), chunk, cache_salt=f"{prompt}-{chunk}"
        )
    assert done.prompt_token_ids == expected.prompt_token_ids, "prompt ids = the processor's"
    assert_greedy_match(done.token_ids, expected, f"{stack.name} {prompt} chunk {chunk}")

    chunks = done.stats.decoder.chunks
    assert [c.start for c in chunks] == list(range(0, len(expected.prompt_token_ids), chunk))
    media = stack.media_token_ids()
    for c in chunks:
        # Exactly the rows of the chunk's placeholder positions: bytes / minimum = 1.
        rows = sum(1 for t in expected.prompt_token_ids[c.start : c.end] if t in media)
        assert c.num_embedding_rows == rows
        assert c.num_embedding_bytes == rows * stack.reference.row_bytes
    if prompt == "one-video":  # the video is larger than either chunk: some chunk cuts it
        video = stack.builder.build(to_chat_inputs(PROMPTS[prompt])).items
        start, end = video[0].range.offset, video[-1].range.end
        assert any(start < c.start < end for c in chunks), (start, end, chunk)


def test_repeated_request_comes_from_the_prefix_cache(stack):
    prompt = [("user", [VIDEOS["short"], "Describe every moment of this video in careful detail."])]
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS)
    with Client(stack.gateway) as client:
        first = client.complete(messages(prompt), greedy(), 64, cache_salt="repeat")
        before = encoder_stats(stack)
        again = client.complete(messages(prompt), greedy(), 64, cache_salt="repeat")
    after = encoder_stats(stack)
    for done in (first, again):
        assert_greedy_match(done.token_ids, expected, f"{stack.name} repeated")
    video_end = max(item.range.end for item in stack.builder.build(to_chat_inputs(prompt)).items)
    assert again.stats.decoder.num_cached_prompt_tokens >= video_end
    assert again.stats.num_embedding_bytes == 0, "no embedding rows for cached positions"
    assert after.num_items_computed == before.num_items_computed, "no encoder pass"


def test_sampling_options_change_the_frames_and_the_cache_entry(stack):
    """num_frames (vLLM's mm_processor_kwargs) samples other frames: generate()'s tokens
    for those frames, another content hash, another encoder pass."""
    prompt = [("user", [VIDEOS["wide"], "What moves?"])]
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS, num_frames=4)
    default = stack.builder.build(to_chat_inputs(prompt))
    fewer = stack.builder.build(to_chat_inputs(prompt), {"num_frames": 4})
    assert default.items[0].range.content_hash != fewer.items[0].range.content_hash
    assert sum(i.range.length for i in fewer.items) < sum(i.range.length for i in default.items)
    before = encoder_stats(stack)
    with Client(stack.gateway) as client:
        done = client.complete(
            messages(prompt), greedy(), 64, mm_processor_kwargs={"num_frames": 4}
        )
    assert_greedy_match(done.token_ids, expected, f"{stack.name} num_frames")
    assert encoder_stats(stack).num_items_computed == before.num_items_computed + 1


def test_http_video_url_gives_the_same_tokens(stack):
    def part(item):
        if isinstance(item, str):
            return {"type": "text", "text": item}
        if isinstance(item, Video):
            url = "data:video/mp4;base64," + base64.b64encode(item.data).decode()
            return {"type": "video_url", "video_url": {"url": url}}
        url = "data:image/png;base64," + base64.b64encode(item).decode()
        return {"type": "image_url", "image_url": {"url": url}}

    chat = [
        {"role": role, "content": [part(p) for p in parts]}
        for role, parts in PROMPTS["video-and-image"]
    ]
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1", api_key="unused", max_retries=0
    )
    answer = client.chat.completions.create(
        model="",
        messages=chat,
        max_tokens=MAX_NEW_TOKENS,
        temperature=0,
        extra_body={"max_chunk_tokens": 64, "cache_salt": "http"},
        timeout=120,
    )
    tokens = answer.model_extra["tessera"]["token_ids"]
    assert_greedy_match(tokens, stack.expected["video-and-image"], f"{stack.name} http")


def bad_videos() -> dict[str, tuple[bytes, str]]:
    """Each bad input and a fragment of the message that says what to fix."""
    long = VIDEOS["long"].data
    return {
        "not a video": (IMAGE, "send an MP4"),
        "truncated": (long[: len(long) // 3], "send"),
        "10 hours": (make_video(2, Fraction(1, 18_000), 32, 32, "mkv"), "--max-video-seconds"),
        "20000x20000 frames": (claiming_frame_size(20_000, 20_000), "--max-video-frame-pixels"),
        "no frames": (no_frames(), "could not be read"),
        "empty": (b"", "empty"),
    }


def test_bad_videos_are_refused_and_the_next_request_is_served(stack):
    """Each bad video: INVALID_ARGUMENT over gRPC and 400 over HTTP, with what to fix;
    then a good request gets generate()'s tokens."""
    url = f"http://127.0.0.1:{stack.http_port}/v1/chat/completions"
    with Client(stack.gateway) as client:
        for name, (data, fragment) in bad_videos().items():
            with pytest.raises(grpc.RpcError) as refused:
                client.complete([Message("user", [Video(data), "What is it?"])], greedy())
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert fragment in refused.value.details(), (name, refused.value.details())
            video_url = "data:video/mp4;base64," + base64.b64encode(data).decode()
            content = [{"type": "video_url", "video_url": {"url": video_url}}]
            answer = httpx.post(url, json={"messages": [{"role": "user", "content": content}]})
            assert answer.status_code == 400, (name, answer.text)
            assert fragment in answer.json()["error"]["message"], name
        done = client.complete(messages(PROMPTS["two-videos"]), greedy(), cache_salt="after")
    assert_greedy_match(done.token_ids, stack.expected["two-videos"], f"{stack.name} after bad")


def test_a_chunks_slices_on_one_encoder_come_in_one_call(stack):
    """Two videos (Qwen3-VL: a range per temporal step) in one chunk: one
    GetEmbeddingSlices call for all of their rows. The videos are encoded first, by a
    request of other text, so the call finds them (an item still in flight on the
    gateway's Encode would send the batch down the slice-by-slice path)."""
    videos = [VIDEOS["wide"], "and", VIDEOS["short"]]
    warm = [("user", ["Look:", *videos, "which is longer?"])]
    prompt = [("user", ["Now compare:", *videos, "which has more motion?"])]
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS)
    with Client(stack.gateway) as client:
        client.complete(messages(warm), greedy(), 2048, cache_salt="one-call")
        before = encoder_stats(stack)
        done = client.complete(messages(prompt), greedy(), 2048, cache_salt="one-call")
    after = encoder_stats(stack)
    assert_greedy_match(done.token_ids, expected, f"{stack.name} one call")
    ranges = stack.builder.build(to_chat_inputs(prompt)).items
    fetched = [c for c in done.stats.decoder.chunks if c.num_embedding_rows]
    assert len(fetched) == 1 and len(ranges) >= 2, (fetched, len(ranges))
    assert fetched[0].num_embedding_rows == sum(r.range.length for r in ranges)
    assert after.num_slice_calls - before.num_slice_calls == 1
    assert after.num_items_computed == before.num_items_computed


def test_a_batch_missing_an_item_falls_back_to_slice_by_slice(stack):
    """Straight to the decoder, so no gateway Encode runs first: one chunk holds a video
    the encoder has and one it has never seen. The batched call is refused (NOT_FOUND);
    each slice is then fetched on its own: the held video's rows are served, the new
    one is sent to be encoded once, and the tokens are generate()'s."""
    held, new = VIDEOS["short"], Video(make_video(12, 4.0, 96, 80, "mov", seed=9))
    prompt = [("user", [held, "versus", new, "which moves more?"])]
    expected = stack.reference.generate(prompt, MAX_NEW_TOKENS)
    with Client(stack.gateway) as client:  # the held video, encoded without a salt
        client.complete([Message("user", [held, "Hello."])], greedy())
    built = stack.builder.build(to_chat_inputs(prompt))
    request = decoder_pb2.DecodeRequest(
        request_id="fallback",
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
        max_chunk_tokens=2048,
    )
    before = encoder_stats(stack)
    with grpc.insecure_channel(stack.cluster.address("decoder")) as channel:
        responses = list(
            decoder_pb2_grpc.DecoderServiceStub(channel).Generate(request, timeout=120)
        )
    after = encoder_stats(stack)
    tokens = [t for r in responses if r.HasField("tokens") for t in r.tokens.token_ids]
    assert_greedy_match(tokens, expected, f"{stack.name} fallback")
    assert after.num_items_computed == before.num_items_computed + 1, "only the new video"
    # The refused batch, then at least one call per range.
    assert after.num_slice_calls - before.num_slice_calls >= 1 + len(built.items)
