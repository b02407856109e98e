"""The OpenAI-compatible HTTP API, through the real `openai` client."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import time

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gateway import openapi
from tessera.client import Client, Message
from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster, http_gateway
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import common_pb2

IMAGE_A = noise_image(1001, 40, 30)
IMAGE_B = noise_image(1002, 30, 60)


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


class MediaHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/a.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(IMAGE_A)
        elif self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("?to=", 1)[1])
            self.end_headers()
        elif self.path == "/slow.png":
            time.sleep(3)
            self.send_response(200)
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def media_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MediaHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"localhost:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def api(cluster, demo_model_dir):
    """A gateway with the HTTP API in front of the session's encoder and decoder."""
    with http_gateway(
        cluster,
        demo_model_dir,
        "--served-model-name",
        "tessera-demo",
        "--allowed-media-domains",
        "localhost,127.0.0.1,169.254.169.254",
        "--allow-private-media-hosts",
        "localhost",
        "--media-fetch-timeout-seconds",
        "1",
        "--limit-mm-per-prompt",
        "3",
        "--max-request-bytes",
        str(1 << 20),
    ) as own:
        yield own


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api.http + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(client, content, **options):
    options = {"model": "tessera-demo", "max_tokens": 8, "temperature": 0, **options}
    return client.chat.completions.create(
        messages=[{"role": "user", "content": content}], **options
    )


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_image_as_data_url_equals_generate_and_grpc(client, api, reference):
    response = chat(client, [image_part(data_url(IMAGE_A)), {"type": "text", "text": "What?"}])
    expected = reference.generate([("user", [IMAGE_A, "What?"])], 8)
    tokens = response.model_extra["tessera"]["token_ids"]
    assert_greedy_match(tokens, expected)
    assert response.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert response.choices[0].finish_reason in ("stop", "length")
    with Client(api.address("gateway")) as grpc_client:
        via_grpc = grpc_client.complete(
            [Message("user", [IMAGE_A, "What?"])], common_pb2.SamplingParams(max_tokens=8)
        )
    assert via_grpc.token_ids == tokens and via_grpc.text == response.choices[0].message.content


def test_image_from_an_allowed_local_server(client, media_server, reference):
    response = chat(
        client, [image_part(f"http://{media_server}/a.png"), {"type": "text", "text": "Hm?"}]
    )
    expected = reference.generate([("user", [IMAGE_A, "Hm?"])], 8)
    assert_greedy_match(response.model_extra["tessera"]["token_ids"], expected)


def test_two_images_streaming_with_usage(client, reference):
    content = [
        image_part(data_url(IMAGE_A)),
        {"type": "text", "text": "and"},
        image_part(data_url(IMAGE_B)),
        {"type": "text", "text": "compare"},
    ]
    stream = chat(client, content, stream=True, stream_options={"include_usage": True})
    text, finish_reasons, usage = [], [], None
    for event in stream:
        for choice in event.choices:
            text.append(choice.delta.content or "")
            if choice.finish_reason:
                finish_reasons.append(choice.finish_reason)
        if event.usage:
            usage = event.usage
    expected = reference.generate([("user", [IMAGE_A, "and", IMAGE_B, "compare"])], 8)
    assert len(finish_reasons) == 1
    assert usage.completion_tokens == len(expected.token_ids)
    assert usage.prompt_tokens == len(expected.prompt_token_ids)
    decoded = reference.processor.tokenizer.decode(expected.token_ids, skip_special_tokens=True)
    assert "".join(text) == decoded


def test_stream_ends_with_done(api):
    body = {
        "model": "tessera-demo",
        "max_tokens": 3,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    with httpx.stream("POST", api.http + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert sum('"finish_reason": "' in line for line in lines) == 1


BAD = {
    "undecodable image": (
        [image_part("data:image/png;base64," + base64.b64encode(b"nope").decode())],
        {},
        "decoded",
    ),
    "not base64": ([image_part("data:image/png;base64,@@@")], {}, "base64"),
    "too many images": ([image_part(data_url(IMAGE_A))] * 4, {}, "at most 3"),
    "audio to an image model": (
        [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}],
        {},
        "takes image input",
    ),
    "unknown part type": ([{"type": "video", "video": {}}], {}, "not supported"),
    "unknown model": ("hi", {"model": "gpt-9"}, "not served here"),
    "n above the bound": ("hi", {"n": 17}, "n must be an integer"),
    "n true": ("hi", {"n": True}, "n must be an integer"),
    "max tokens beyond context": ("hi", {"max_tokens": 5000}, "max_tokens"),
    "prompt beyond context": ("word " * 2100, {}, "context"),
    "loopback URL": ([image_part("http://127.0.0.1:9/a.png")], {}, "loopback"),
    "metadata URL": ([image_part("http://169.254.169.254/latest")], {}, "link-local"),
    "host not allowed": (
        [image_part("http://example.com/a.png")],
        {},
        "not an allowed media domain",
    ),
    "temperature out of range": ("hi", {"temperature": 7}, "temperature"),
    # Integers are integers: 2.5 used to be cut to 2, and true taken as 1.
    "fractional max_tokens": ("hi", {"max_tokens": 2.5}, "max_tokens must be an integer"),
    "fractional seed": ("hi", {"seed": 1.5}, "seed must be an integer"),
    "boolean max_chunk_tokens": (
        "hi",
        {"extra_body": {"max_chunk_tokens": True}},
        "max_chunk_tokens must be an integer",
    ),
    # Checked even with max_tokens given, and without logprobs.
    "bad max_completion_tokens beside max_tokens": (
        "hi",
        {"max_completion_tokens": "8"},
        "max_completion_tokens must be an integer",
    ),
    "bad top_logprobs without logprobs": ("hi", {"top_logprobs": 99}, "top_logprobs"),
    # Booleans are booleans: "no" used to be truthy, so it turned streaming on.
    "stream as a string": ("hi", {"extra_body": {"stream": "no"}}, "stream must be true or false"),
    "logprobs as an object": ("hi", {"extra_body": {"logprobs": {}}}, "logprobs must be true"),
    "include_usage as a number": (
        "hi",
        {"stream_options": {"include_usage": 1}},
        "stream_options.include_usage must be true or false",
    ),
    # Checked without stream too: it used to be read only when streaming.
    "stream_options a list without stream": (
        "hi",
        {"extra_body": {"stream_options": [1]}},
        "stream_options must be an object",
    ),
    "mm_processor_kwargs false": (
        "hi",
        {"extra_body": {"mm_processor_kwargs": False}},
        "mm_processor_kwargs must be an object",
    ),
    # audio_url follows the image rules (checked before the model's modality).
    "audio URL at loopback": (
        [{"type": "audio_url", "audio_url": {"url": "http://127.0.0.1:9/a.wav"}}],
        {},
        "loopback",
    ),
    "audio URL at metadata": (
        [{"type": "audio_url", "audio_url": {"url": "http://169.254.169.254/a.wav"}}],
        {},
        "link-local",
    ),
    "unknown input_audio format": (
        [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "aiff"}}],
        {},
        "format",
    ),
    "input_audio data with padding after a whole group": (
        [{"type": "input_audio", "input_audio": {"data": "UklGRgAA=", "format": "wav"}}],
        {},
        "must be base64",
    ),
    "unknown input_audio field": (
        [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "url": "x"}}],
        {},
        "takes data and format",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_are_400_and_the_next_succeeds(client, case):
    content, options, phrase = BAD[case]
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, content, **options)
    assert (
        phrase in caught.value.body["message"]
        if isinstance(caught.value.body, dict)
        else str(caught.value)
    )
    assert chat(client, "still fine?").choices[0].message.content is not None


def test_null_is_unset_as_openai_documents(api):
    """OpenAI's optional fields are nullable; n: null used to be refused as n != 1."""
    unset = dict.fromkeys(["n", "seed", "stop", "top_p", "logprobs"])
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **unset}
    response = httpx.post(api.http + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.json()["tessera"]["token_ids"]) == 2


def test_a_null_max_completion_tokens_leaves_max_tokens_in_force(api):
    """A null max_completion_tokens used to hide max_tokens: the decoder's default length, not 2."""
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "max_completion_tokens": None,
    }
    response = httpx.post(api.http + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.json()["tessera"]["token_ids"]) == 2


def test_redirect_to_a_private_address_is_refused(client, media_server):
    target = f"http://127.0.0.1:{media_server.split(':')[1]}/a.png"
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, [image_part(f"http://{media_server}/redirect?to={target}")])
    assert "loopback" in str(caught.value)


def test_slow_media_server_hits_the_timeout(client, media_server):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, [image_part(f"http://{media_server}/slow.png")])
    assert "longer than" in str(caught.value)


def test_malformed_edges_are_400_in_openai_shape(api):
    """Each of these used to close the connection with a 500."""
    url = api.http + "/v1/chat/completions"
    closed_port = free_port()
    cases = {
        "lone surrogate": (
            json.dumps({"messages": [{"role": "user", "content": "a \ud800 b"}]}),
            "lone surrogate",
        ),
        "nested brackets": ("[" * 100_000, "nests too deeply"),
        "stream_options not an object": (
            json.dumps(
                {"messages": [{"role": "user", "content": "hi"}], "stream": True}
                | {"stream_options": "x"}
            ),
            "stream_options",
        ),
        "part type not a string": (
            json.dumps({"messages": [{"role": "user", "content": [{"type": {}}]}]}),
            "type must be a string",
        ),
        "input_audio data not a string": (
            json.dumps(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "input_audio", "input_audio": {"data": [1]}}],
                        }
                    ]
                }
            ),
            "must be a base64 string",
        ),
        "malformed URL": (
            json.dumps({"messages": [{"role": "user", "content": [image_part("http://[::1")]}]}),
            "malformed",
        ),
        "refused connection to an allowed host": (
            json.dumps(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [image_part(f"http://localhost:{closed_port}/a.png")],
                        }
                    ]
                }
            ),
            "failed",
        ),
    }
    for name, (body, phrase) in cases.items():
        headers = {"content-type": "application/json"}
        response = httpx.post(url, content=body, headers=headers, timeout=30)
        assert response.status_code == 400, (name, response.status_code, response.text)
        assert phrase in response.json()["error"]["message"], name
    still = httpx.post(url, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    assert still.status_code == 200


def test_an_overlong_request_id_is_400_and_not_echoed(api):
    body = {"model": "tessera-demo", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"X-Request-Id": "x" * 4000}
    response = httpx.post(api.http + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "X-Request-Id"
    assert len(response.headers["X-Request-Id"]) <= 128


def test_oversized_body_is_413(api):
    body = {"model": "tessera-demo", "messages": [{"role": "user", "content": "x" * (2 << 20)}]}
    response = httpx.post(api.http + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 413
    assert "--max-request-bytes" in response.json()["error"]["message"]


def test_models_health_ready_and_request_id(api):
    models = httpx.get(api.http + "/v1/models").json()
    assert models["data"][0]["id"] == "tessera-demo"
    assert httpx.get(api.http + "/health").status_code == 200
    assert httpx.get(api.http + "/openapi.json").json() == openapi.DOCUMENT
    ready = httpx.get(api.http + "/ready")
    assert ready.status_code == 200 and all(ready.json()["backends"].values())
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(
        api.http + "/v1/chat/completions", json=body, headers={"X-Request-Id": "req-42"}, timeout=30
    )
    assert response.headers["X-Request-Id"] == "req-42"
    assert response.json()["id"] == "chatcmpl-req-42"


def scrape(api) -> dict[str, float]:
    text = httpx.get(api.http + "/metrics").text
    return {
        sample.name + str(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_parse_and_move(client, api):
    before = scrape(api)
    chat(client, "count me")
    after = scrape(api)
    model = "('model_name', 'tessera-demo')"
    ok = f"tessera_gateway_requests_total[{model}, ('outcome', 'ok')]"
    assert after[ok] == before.get(ok, 0) + 1
    ttft = f"tessera_gateway_time_to_first_token_seconds_count[{model}]"
    assert after[ttft] > before.get(ttft, 0)
    assert after[f"tessera_gateway_num_requests_running[{model}]"] == 0


def decoder_stats(cluster):
    import grpc

    from tessera.v1 import decoder_pb2, decoder_pb2_grpc

    with grpc.insecure_channel(cluster.address("decoder")) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        return stub.GetStats(decoder_pb2.GetDecoderStatsRequest(), timeout=10)


RUNNING = "tessera_gateway_num_requests_running[('model_name', 'tessera-demo')]"


def test_a_client_that_disconnects_mid_stream_frees_everything(api, cluster):
    start = decoder_stats(cluster)
    body = {
        "model": "tessera-demo",
        "max_tokens": 1500,
        "stream": True,
        "messages": [{"role": "user", "content": "Tell me everything."}],
    }
    with httpx.stream("POST", api.http + "/v1/chat/completions", json=body, timeout=30) as r:
        for count, _ in enumerate(r.iter_lines()):
            if count > 5:
                break  # hang up mid-stream
    deadline = time.monotonic() + 30  # a bound on a slow machine, not a speed
    while time.monotonic() < deadline:
        stats, gauges = decoder_stats(cluster), scrape(api)
        if stats.num_running == 0 and gauges[RUNNING] == 0:
            break
        time.sleep(0.05)
    assert stats.num_running == 0 and gauges[RUNNING] == 0
    assert stats.num_free_kv_blocks == start.num_free_kv_blocks == stats.num_kv_blocks
    assert stats.num_aborted > start.num_aborted


def test_queue_overflow_is_429_then_normal_service(cluster, demo_model_dir):
    """One request waits for its first token behind a long prefill; with room for one
    queued request, the next is refused at once, and served once the first is done."""
    own = Cluster()
    port = free_port()
    own.start(
        "gateway",
        "gateway",
        [
            "--model",
            str(demo_model_dir),
            "--encoders",
            cluster.address("encoder"),
            "--decoders",
            cluster.address("decoder"),
            "--http-port",
            str(port),
            "--max-queued-requests",
            "1",
            "--served-model-name",
            "tessera-demo",
        ],
    )
    try:
        own.wait_ready()
        own.http = f"http://127.0.0.1:{port}"
        url = f"{own.http}/v1/chat/completions"
        slow = {
            "messages": [{"role": "user", "content": "word " * 500}],
            "max_tokens": 1,
            "max_chunk_tokens": 1,
            "cache_salt": "queue-test",
        }
        answers = []
        first = threading.Thread(
            target=lambda: answers.append(httpx.post(url, json=slow, timeout=120))
        )
        first.start()
        # The next request is refused only while the first one waits for its first
        # token: wait for that state (its 500 one-token chunks take many steps).
        waiting = "tessera_gateway_num_requests_waiting[('model_name', 'tessera-demo')]"
        deadline = time.monotonic() + 60
        while scrape(own)[waiting] < 1:
            assert time.monotonic() < deadline and first.is_alive(), answers
            time.sleep(0.01)
        quick = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        refused = httpx.post(url, json=quick, timeout=30)
        assert refused.status_code == 429, answers and answers[0].text[:300]
        assert refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        first.join(120)
        assert httpx.post(url, json=quick, timeout=30).status_code == 200
        with Client(own.address("gateway")) as grpc_client:
            assert grpc_client.complete([Message("user", ["hi"])]).token_ids
    finally:
        own.stop()


URLS = ["http://[::1", "data:image/png;base64,@@", "http://localhost:9/a.png", "ftp://x/y"]
# Text with lone surrogates too: JSON can carry them ("\ud800"), Python strings hold them.
_STRINGS = st.text(max_size=20) | st.text(
    alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4
)
_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _STRINGS
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_PARTS = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_audio", "audio_url", "video"])},
    optional={
        "text": _STRINGS | _JSON,
        "image_url": _JSON | st.fixed_dictionaries({"url": st.sampled_from(URLS) | _STRINGS}),
        "input_audio": _JSON,
        "audio_url": _JSON,
    },
)
_MESSAGES = st.just([{"role": "user", "content": "hi"}]) | st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | _JSON},
        optional={"content": _STRINGS | st.lists(_PARTS, max_size=3) | _JSON},
    ),
    max_size=3,
)
_FIELDS = [
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
    "n", "stream", "stream_options", "logprobs", "top_logprobs", "mm_processor_kwargs",
    "max_chunk_tokens", "cache_salt",
]  # fmt: skip
# Mostly a plausible request with up to two fields set to anything (so most examples get
# past the first check), sometimes any JSON at all.
_BODIES = (
    st.builds(
        lambda messages, extra: {"messages": messages, "max_tokens": 2, **extra},
        _MESSAGES,
        st.dictionaries(st.sampled_from(_FIELDS), _JSON | st.booleans(), max_size=2),
    )
    | _JSON
)


def test_random_bodies_never_get_a_5xx(api):
    """Hypothesis (derandomized) against /v1/chat/completions: every body gets a 2xx or a
    4xx in OpenAI's error shape, never a 5xx or a dropped connection.

    Kept beside test_http_fuzz.py, which generates from the OpenAPI document: this one
    sends what a schema-driven generator does not (lone surrogates, which schemathesis'
    UTF-8 codec leaves out; any JSON at all in any field; malformed, refused and
    unreachable media URLs)."""
    url = api.http + "/v1/chat/completions"

    @settings(max_examples=100, deadline=None, derandomize=True)
    @given(body=_BODIES)
    def check(body) -> None:
        # json.dumps escapes lone surrogates, as a client's JSON encoder may.
        content = json.dumps(body)
        headers = {"content-type": "application/json"}
        response = httpx.post(url, content=content, headers=headers, timeout=60)
        assert response.status_code < 500, (body, response.status_code, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"], body

    check()
    assert chat_ok(api)


def chat_ok(api) -> bool:
    body = {"messages": [{"role": "user", "content": "still fine?"}], "max_tokens": 2}
    return httpx.post(api.http + "/v1/chat/completions", json=body, timeout=60).status_code == 200
