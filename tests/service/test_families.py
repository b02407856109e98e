"""Every model family through the real services: greedy output equals the checkpoint's own
`generate()` (fed the processor's own inputs for the same chat messages), over gRPC and
HTTP, with 1-3 images of different sizes and aspect ratios, at chunk sizes 16, 64 and
unchunked; a repeated request comes from the prefix cache; 8 mixed requests run
concurrently; bad layouts sent straight to the decoder are refused.

One stack (encoder, decoder, gateway with HTTP) per family, started once for all of the
family's cases.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest

from gateway.prompt import Prompt, PromptBuilder
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.client import Client, Message
from tessera.demo_models import DEMO_FAMILIES, make_demo_model
from tessera.launcher import free_port
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc
from tessera.wire import range_to_proto
from tests.cluster import Cluster
from tests.reference import (
    Reference,
    ReferenceOutput,
    assert_greedy_match,
    noise_image,
    to_chat_inputs,
)

MAX_NEW_TOKENS = 8
CHUNK_SIZES = [16, 64, 0]  # 0: unchunked (the decoder's limit, above every prompt here)

WIDE, TALL, SMALL, LARGE = (
    noise_image(11, 90, 40),
    noise_image(12, 35, 70),
    noise_image(13, 60, 45),
    noise_image(14, 130, 100),
)
PROMPTS = {
    "one-image": [("user", [SMALL, "What is in this picture?"])],
    "two-images": [
        ("system", ["You are a careful assistant."]),
        ("user", [WIDE, "and", TALL, "compare them"]),
    ],
    "three-images": [("user", [TALL, "first", LARGE, "then", WIDE, "which is widest?"])],
}


@dataclass
class FamilyStack:
    name: str
    model_dir: Path
    cluster: Cluster
    http_port: int
    reference: Reference
    expected: dict[str, ReferenceOutput]
    builder: PromptBuilder  # the gateway's own prompt code, in this process

    @property
    def gateway(self) -> str:
        return self.cluster.address("gateway")


@pytest.fixture(scope="module", params=list(DEMO_FAMILIES))
def stack(request, tmp_path_factory) -> FamilyStack:
    name = request.param
    model_dir = make_demo_model(tmp_path_factory.mktemp(name) / "tiny", family=name, seed=0)
    model = ["--model", str(model_dir)]
    cluster = Cluster()
    http_port = free_port()
    try:
        encoder = cluster.start("encoder", "encoder", model)
        decoder = cluster.start("decoder", "decoder", model)
        cluster.start(
            "gateway",
            "gateway",
            [*model, "--encoders", encoder, "--decoders", decoder, "--http-port", str(http_port)],
        )
        reference = Reference(model_dir)
        expected = {key: reference.generate(p, MAX_NEW_TOKENS) for key, p in PROMPTS.items()}
        builder = PromptBuilder(
            load_family(str(model_dir), LoadOptions(ModelPart.PROCESSOR)), 10**8, 16
        )
        cluster.wait_ready()
        yield FamilyStack(name, model_dir, cluster, http_port, reference, expected, builder)
    finally:
        cluster.stop()


def greedy() -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)


def messages(prompt) -> list[Message]:
    return [Message(role, parts) for role, parts in prompt]


@pytest.mark.parametrize("chunk", CHUNK_SIZES, ids=lambda c: f"chunk{c or '-all'}")
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
    assert chunks[0].start == 0 and chunks[-1].end == len(expected.prompt_token_ids)
    placeholder = stack.reference.image_token_id
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
        to_chat_inputs(PROMPTS[prompt] if isinstance(prompt, str) else prompt)
    )


def test_http_api_gives_the_same_tokens(stack):
    expected = stack.expected["two-images"]
    content = []
    for part in PROMPTS["two-images"][1][1]:
        if isinstance(part, bytes):
            url = "data:image/png;base64," + base64.b64encode(part).decode()
            content.append({"type": "image_url", "image_url": {"url": url}})
        else:
            content.append({"type": "text", "text": part})
    body = {
        "messages": [
            {"role": "system", "content": PROMPTS["two-images"][0][1][0]},
            {"role": "user", "content": content},
        ],
        "max_tokens": MAX_NEW_TOKENS,
        "temperature": 0,
        "max_chunk_tokens": 16,
        "cache_salt": "http",
    }
    url = f"http://127.0.0.1:{stack.http_port}/v1/chat/completions"
    answer = httpx.post(url, json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert_greedy_match(answer.json()["tessera"]["token_ids"], expected, f"{stack.name} http")


def test_processing_options_change_rows_and_cache_entries(stack):
    """Qwen-VL's max_pixels (vLLM's mm_processor_kwargs) changes an image's rows: the
    output still equals generate() with the same processor setting, and the setting gets
    a cache entry of its own. Families without options refuse them."""
    prompt = [("user", [LARGE, "What is in this picture?"])]
    if not stack.name.startswith("qwen"):
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
        first = client.complete(
            messages(prompt), greedy(), cache_salt="options", mm_processor_kwargs=options
        )
        again = client.complete(
            messages(prompt), greedy(), cache_salt="options", mm_processor_kwargs=options
        )
    assert first.prompt_token_ids == expected.prompt_token_ids
    assert_greedy_match(first.token_ids, expected, f"{stack.name} max_pixels")
    assert first.stats.num_items_computed == 1, "another setting is another cache entry"
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
    prompt = [("user", [SMALL, "Describe every part of this picture in careful detail."])]
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
    cases = [(prompt, chunk) for prompt in PROMPTS for chunk in (16, 0)][:6]
    cases += [("one-image", 64), ("text-only", 16)]
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
                    messages(PROMPTS.get(prompt, text_only)), greedy(), chunk, cache_salt="mix"
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
    good = valid_decode_request(stack, "two-images")
    with grpc.insecure_channel(stack.cluster.address("decoder")) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        for name, bad in bad_layouts(good).items():
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Generate(bad, timeout=60))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
            assert "item at offset" in refused.value.details(), refused.value.details()
        responses = list(stub.Generate(good, timeout=120))
    tokens = [t for r in responses if r.HasField("tokens") for t in r.tokens.token_ids]
    assert_greedy_match(tokens, stack.expected["two-images"], f"{stack.name} direct")


def encoder_stats(stack: FamilyStack) -> encoder_pb2.EncoderStats:
    with grpc.insecure_channel(stack.cluster.address("encoder")) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
