"""Every sampling field over HTTP with the real `openai` client, against the demo stack:
repetition_penalty as the checkpoint's own generate() applies it, logit_bias, min_tokens,
stop_token_ids and ignore_eos, seeds, 400s naming the field, and defaults from the
checkpoint's generation_config."""

from __future__ import annotations

import json
import shutil

import openai
import pytest
import torch

from gateway.generation_defaults import NEUTRAL, SamplingDefaults, load_sampling_defaults
from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import ReferenceOutput, assert_greedy_match

MODEL = "tessera-demo"
PROMPT = "Say something, anything, and say it again."
# What the checkpoint's generation_config says in the defaults test.
CHECKPOINT_SAMPLING = {"temperature": 0.7, "top_k": 5, "repetition_penalty": 1.3}


def start_gateway(cluster: Cluster, model_dir, *extra: str) -> Cluster:
    """A gateway with the HTTP API in front of the session's encoder and decoder."""
    own = Cluster()
    port = free_port()
    own.start(
        "gateway",
        "gateway",
        [
            "--model",
            str(model_dir),
            "--encoders",
            cluster.address("encoder"),
            "--decoders",
            cluster.address("decoder"),
            "--http-port",
            str(port),
            "--served-model-name",
            MODEL,
            *extra,
        ],
    )
    own.wait_ready()
    own.http = f"http://127.0.0.1:{port}"
    return own


def client_of(gateway: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.http + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def api(cluster, demo_model_dir):
    gateway = start_gateway(cluster, demo_model_dir)
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def client(api):
    return client_of(api)


def chat(client: openai.OpenAI, **options):
    options = {"model": MODEL, "max_tokens": 8, "temperature": 0, **options}
    return client.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **options)


def token_ids(response) -> list[int]:
    return response.model_extra["tessera"]["token_ids"]


def vllm_extras(**fields) -> dict:
    """vLLM's extra fields, which the openai client sends through extra_body."""
    return {"extra_body": fields}


@torch.inference_mode()
def hf_greedy(reference, max_new_tokens: int, **generate_options) -> ReferenceOutput:
    """The checkpoint's own generate() with its own logits processors."""
    inputs = reference.inputs([("user", [PROMPT])])
    out = reference.model.generate(
        **inputs,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
        **generate_options,
    )
    prompt = inputs["input_ids"][0].tolist()
    return ReferenceOutput(
        prompt_token_ids=prompt,
        token_ids=out.sequences[0, len(prompt) :].tolist(),
        logits=[step[0].float() for step in out.scores],  # after the processors
    )


@pytest.fixture(scope="module")
def eos(reference) -> int:
    return int(reference.model.generation_config.eos_token_id)


def test_repetition_penalty_equals_hf_generate(client, reference):
    """Below 1 the penalty favours seen tokens: this random checkpoint never repeats one
    greedily, so a penalty above 1 would change nothing here."""
    ours = token_ids(chat(client, max_tokens=16, **vllm_extras(repetition_penalty=0.7)))
    plain = hf_greedy(reference, 16)
    penalized = hf_greedy(reference, 16, repetition_penalty=0.7)
    assert penalized.token_ids != plain.token_ids  # else the penalty was not exercised
    assert_greedy_match(ours, penalized, "repetition_penalty=0.7")
    assert len(ours) == len(penalized.token_ids)


def test_logit_bias_forces_a_token(client):
    free = token_ids(chat(client, max_tokens=4))
    forced = next(t for t in range(10, 100) if t not in free)
    response = chat(client, max_tokens=4, logit_bias={str(forced): 100})
    assert token_ids(response) == [forced] * 4


def test_min_tokens_holds_back_eos(client, eos):
    """EOS is made the top token; min_tokens keeps it back, as it would with ignore_eos,
    for exactly min_tokens tokens."""
    towards_eos = {str(eos): 100}
    assert token_ids(chat(client, logit_bias=towards_eos)) == [eos]
    held = chat(client, logit_bias=towards_eos, **vllm_extras(min_tokens=3))
    tokens = token_ids(held)
    assert eos not in tokens[:3] and tokens[3:] == [eos], tokens
    assert held.choices[0].finish_reason == "stop"
    ignored = chat(client, max_tokens=5, logit_bias=towards_eos, **vllm_extras(ignore_eos=True))
    assert token_ids(ignored) == [eos] * 5 and ignored.choices[0].finish_reason == "length"


def test_stop_token_ids_stop_and_min_tokens_holds_them_back(client):
    stop = token_ids(chat(client, max_tokens=3))[1]
    bias = {str(stop): 100}
    stopped = chat(client, logit_bias=bias, **vllm_extras(stop_token_ids=[stop]))
    assert token_ids(stopped) == [stop] and stopped.choices[0].finish_reason == "stop"
    held = token_ids(
        chat(client, logit_bias=bias, **vllm_extras(stop_token_ids=[stop], min_tokens=2))
    )
    assert stop not in held[:2] and held[2:] == [stop], held


def test_a_seed_reproduces_a_sampled_output(client):
    def sampled(seed: int) -> list[int]:
        options = dict(temperature=1.0, top_p=0.95, presence_penalty=0.5, frequency_penalty=0.5)
        return token_ids(
            chat(client, max_tokens=12, seed=seed, **options, **vllm_extras(top_k=20, min_p=0.01))
        )

    assert sampled(7) == sampled(7)
    assert sampled(8) != sampled(7)


BAD = {
    "presence_penalty": {"presence_penalty": 2.5},
    "frequency_penalty": {"frequency_penalty": -3},
    "repetition_penalty": vllm_extras(repetition_penalty=0),
    "top_k": vllm_extras(top_k=-2),
    "min_p": vllm_extras(min_p=1.5),
    "logit_bias": {"logit_bias": {"5": 101}},
    "stop_token_ids": vllm_extras(stop_token_ids=["a"]),
    "min_tokens": vllm_extras(min_tokens=9),  # above max_tokens (8)
    "ignore_eos": vllm_extras(ignore_eos="yes"),
}


@pytest.mark.parametrize("param", list(BAD))
def test_bad_values_are_400_naming_the_param(client, param):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, **BAD[param])
    assert caught.value.body["param"] == param, caught.value.body
    assert param in caught.value.body["message"]


@pytest.mark.parametrize(
    ("bias", "phrase"),
    [({"x1": 1}, "token id"), ({str(i): 1 for i in range(301)}, "at most 300")],
)
def test_malformed_logit_bias_is_400(client, bias, phrase):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, logit_bias=bias)
    assert caught.value.body["param"] == "logit_bias" and phrase in caught.value.body["message"]


def test_a_token_outside_the_vocabulary_is_400(client, reference):
    vocab = reference.model.config.get_text_config().vocab_size
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, logit_bias={str(vocab): 5})
    assert "logit_bias" in caught.value.body["message"]
    assert token_ids(chat(client, max_tokens=2))  # the stack is still fine


@pytest.fixture(scope="module")
def configured_model_dir(demo_model_dir, tmp_path_factory):
    """The demo checkpoint with sampling settings in its generation_config."""
    copy = tmp_path_factory.mktemp("configured") / "tiny"
    shutil.copytree(demo_model_dir, copy)
    path = copy / "generation_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "do_sample": True, **CHECKPOINT_SAMPLING}))
    return copy


def test_generation_config_modes(configured_model_dir, demo_model_dir):
    assert load_sampling_defaults(str(configured_model_dir), "auto") == SamplingDefaults(
        **CHECKPOINT_SAMPLING
    )
    assert load_sampling_defaults(str(configured_model_dir), "vllm") == NEUTRAL
    assert load_sampling_defaults(str(demo_model_dir), "auto") == NEUTRAL


def test_unset_fields_take_the_checkpoints_defaults(cluster, client, configured_model_dir):
    # The copy's files differ; its content hashes must equal the encoders' own.
    gateway = start_gateway(
        cluster, configured_model_dir, "--model-fingerprint", cluster.fingerprint("encoder")
    )
    try:
        defaulted = token_ids(chat(client_of(gateway), seed=3, temperature=None, max_tokens=12))
    finally:
        gateway.stop()
    explicit = CHECKPOINT_SAMPLING | {"seed": 3, "max_tokens": 12}
    temperature = explicit.pop("temperature")
    spelled_out = chat(
        client,
        temperature=temperature,
        **{k: v for k, v in explicit.items() if k in ("seed", "max_tokens")},
        **vllm_extras(top_k=5, repetition_penalty=1.3),
    )
    assert defaulted == token_ids(spelled_out)
    assert defaulted != token_ids(chat(client, max_tokens=12))  # not greedy
