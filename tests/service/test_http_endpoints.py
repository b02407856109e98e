"""The rest of the OpenAI HTTP surface through the real `openai` client: logprobs, n
choices, /v1/completions, /tokenize, /detokenize, /version, refused fields and error
formats. One gateway (with --max-logprobs 5) in front of the session's encoder and
decoder."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch

from gateway import fields
from tessera import __version__
from tessera.testbed.cluster import http_gateway

MODEL = "tessera-demo"
MAX_LOGPROBS = 5
PROMPT = [("user", ["Count: one two"])]


@pytest.fixture(scope="module")
def api(cluster, demo_model_dir):
    with http_gateway(
        cluster,
        demo_model_dir,
        "--served-model-name",
        MODEL,
        "--max-logprobs",
        str(MAX_LOGPROBS),
    ) as own:
        yield own


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api.http + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(api):
    with httpx.Client(base_url=api.http, timeout=60) as session:
        yield session


def chat(client, **options):
    options = {"model": MODEL, "max_tokens": 6, "temperature": 0, **options}
    messages = [{"role": "user", "content": PROMPT[0][1][0]}]
    return client.chat.completions.create(messages=messages, **options)


def test_logprobs_are_the_models_log_softmax(client, reference):
    response = chat(client, logprobs=True, top_logprobs=3)
    expected = reference.generate(PROMPT, 6)
    content = response.choices[0].logprobs.content
    tokens = response.model_extra["tessera"]["token_ids"]
    assert len(content) == len(tokens) > 0
    for step, (entry, token) in enumerate(zip(content, tokens, strict=True)):
        log_softmax = torch.log_softmax(expected.logits[step], dim=-1)
        assert abs(entry.logprob - float(log_softmax[token])) < 1e-4
        assert entry.bytes == list(entry.token.encode("utf-8"))
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        best = torch.topk(log_softmax, 3).values.tolist()
        assert all(abs(a - b) < 1e-4 for a, b in zip(tops, best, strict=True))


def test_logprobs_off_and_without_top(client):
    assert chat(client).choices[0].logprobs is None
    content = chat(client, logprobs=True).choices[0].logprobs.content
    assert content and all(entry.top_logprobs == [] for entry in content)


def test_streamed_logprobs_equal_the_whole_answer(client):
    whole = chat(client, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    streamed = []
    for chunk in chat(client, logprobs=True, top_logprobs=2, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert [e.token for e in streamed] == [e.token for e in whole]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole], abs=1e-6)


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"logprobs": True, "top_logprobs": MAX_LOGPROBS + 1}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"n": 17}, "n"),
        ({"n": 2, "max_tokens": 1 << 16}, "n"),
    ],
)
def test_bounds_are_400s_naming_the_field(client, options, param):
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, **options)
    assert raised.value.body["param"] == param


def test_n_choices_with_a_seed_are_reproducible_and_differ(client):
    options = {"n": 3, "seed": 7, "temperature": 1.0, "max_tokens": 8}
    first, second = chat(client, **options), chat(client, **options)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in second.choices]
    ids = [c["token_ids"] for c in first.model_extra["tessera"]["choices"]]
    assert len({tuple(i) for i in ids}) > 1  # seed + i: not three copies
    assert first.usage.completion_tokens == sum(len(i) for i in ids)
    # Choice 0 alone equals choice 0 of the three (its seed is the request's).
    single = chat(client, **{**options, "n": 1})
    assert single.choices[0].message.content == texts[0]


def test_n_choices_stream_interleaved_by_index(client):
    options = {"n": 2, "seed": 3, "temperature": 1.0, "max_tokens": 6}
    whole = [c.message.content for c in chat(client, **options).choices]
    texts, finished = ["", ""], set()
    stream = chat(client, stream=True, stream_options={"include_usage": True}, **options)
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert texts == whole and finished == {0, 1}
    assert chunk.usage is not None and chunk.usage.completion_tokens > 0


def test_completions_token_ids_and_text_equal_the_chat_path(client, http, reference):
    expected = reference.generate(PROMPT, 6)
    chat_tokens = chat(client).model_extra["tessera"]["token_ids"]
    by_ids = client.completions.create(
        model=MODEL, prompt=expected.prompt_token_ids, max_tokens=6, temperature=0
    )
    assert by_ids.choices[0].text == chat(client).choices[0].message.content
    assert by_ids.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert by_ids.usage.completion_tokens == len(chat_tokens)
    text = http.post("/detokenize", json={"tokens": expected.prompt_token_ids}).json()["prompt"]
    retokenized = http.post("/tokenize", json={"prompt": text}).json()["tokens"]
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0)
    if retokenized == expected.prompt_token_ids:  # special tokens may not round-trip as text
        assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == len(retokenized)


def test_completions_echo_logprobs_and_stream(client):
    plain = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    echoed = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "Hello" + plain.choices[0].text
    scored = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, logprobs=2
    )
    logprobs = scored.choices[0].logprobs
    assert "".join(logprobs.tokens) == plain.choices[0].text
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset[0] == 0
    streamed = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == plain.choices[0].text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "suffix": "b"}, "suffix"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [[1, 2]]}, "prompt"),
        ({"prompt": "a", "logprobs": MAX_LOGPROBS + 1}, "logprobs"),
        ({"prompt": "a", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": [10**9]}, None),
    ],
)
def test_completions_refusals(http, body, param):
    response = http.post("/v1/completions", json={"model": MODEL, "max_tokens": 2, **body})
    assert response.status_code == 400, response.text
    if param:
        assert response.json()["error"]["param"] == param


def test_tokenize_detokenize_round_trip(client, http):
    tokenized = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world"}).json()
    assert tokenized["count"] == len(tokenized["tokens"]) > 0 and tokenized["max_model_len"] > 0
    back = http.post("/detokenize", json={"model": MODEL, "tokens": tokenized["tokens"]})
    assert back.json() == {"prompt": "Hello world"}
    messages = [{"role": "user", "content": PROMPT[0][1][0]}]
    counted = http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()
    assert counted["count"] == chat(client).usage.prompt_tokens
    assert http.post("/detokenize", json={"tokens": [-1]}).json()["error"]["param"] == "tokens"


def test_version(http):
    assert http.get("/version").json() == {"version": __version__}


UNKNOWN_OR_REFUSED = ["bogus_field", "temprature", *sorted(fields.CHAT_REFUSED)]


@pytest.mark.parametrize("name", UNKNOWN_OR_REFUSED)
def test_every_unknown_or_unimplemented_chat_field_is_a_400_naming_it(client, name):
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, extra_body={name: "x"})
    assert raised.value.body["param"] == name and name in raised.value.body["message"]


def test_no_op_fields_only_with_harmless_values(client):
    assert chat(client, user="u", metadata={"a": "b"}, store=False).choices
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, store=True)
    assert raised.value.body["param"] == "store"


def test_stream_options_without_stream_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, stream_options={"include_usage": True})
    assert raised.value.body["param"] == "stream_options"


def test_errors_are_json_for_404_405_and_415(http):
    for response, status in [
        (http.get("/v1/nothing"), 404),
        (http.get("/v1/chat/completions"), 405),
        (
            http.post(
                "/v1/chat/completions",
                content=json.dumps({"messages": []}),
                headers={"Content-Type": "text/plain"},
            ),
            415,
        ),
    ]:
        assert response.status_code == status
        assert response.headers["content-type"].startswith("application/json")
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_followers_share_the_leaders_prompt_blocks(client):
    """The other choices start once the first has its first token, so its prompt's full
    blocks are cached and they prefill only the rest."""
    long_prompt = "Share these prompt blocks across every choice, please. " * 6
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": long_prompt}],
        max_tokens=2,
        n=3,
        extra_body={"cache_salt": "followers-share-blocks"},  # nothing cached before
    )
    cached = [c["cached_tokens"] for c in response.model_extra["tessera"]["choices"]]
    assert response.usage.prompt_tokens > 32
    assert cached[0] == 0 and all(c >= 16 for c in cached[1:]), cached
