"""Start-up as a vLLM user meets it: `tessera serve` refuses bad flags of every service
before anything starts (one line per bad service, exit 2, no traceback, no model loaded); a
service that fails to load says so in one line; --served-model-name, --limit-mm-per-prompt
and --chat-template as the running gateway applies them."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys

import httpx
import pytest
from PIL import Image

from tessera.client import Client, Message
from tessera.launcher import free_port
from tessera.testbed.cluster import http_gateway
from tessera.testbed.reference import noise_image, to_template
from tessera.v1 import common_pb2

TESSERA = [sys.executable, "-m", "tessera.cli"]
SERVICES = ("encoder", "decoder", "gateway")
# What a service logs when it starts to load (tessera.server), and serve's demo maker.
LOADING = (": loading ", "making the demo model")


def run_tessera(*args: str, home=None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"TESSERA_HOME": str(home)} if home else {})}
    return subprocess.run([*TESSERA, *args], capture_output=True, text=True, timeout=300, env=env)


def lines_of(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(prefix)]


def test_bad_flags_of_two_services_are_two_lines_and_nothing_starts(demo_model_dir):
    result = run_tessera(
        "serve",
        "--model",
        str(demo_model_dir),
        "--port",
        str(free_port()),
        "--kv-cache-memory-fraction",
        "1.5",
        "--limit-mm-per-prompt",
        '{"video": 1}',
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "decoder: --kv-cache-memory-fraction must be in [0, 1) (0: size by --kv-cache-bytes), "
        "got 1.5",
        "gateway: --limit-mm-per-prompt: unknown modality 'video'; tessera takes image, audio",
    ]
    assert "Traceback" not in result.stderr + result.stdout
    assert not any(marker in result.stderr + result.stdout for marker in LOADING)


def test_a_bad_flag_is_refused_before_the_demo_model_is_made(tmp_path):
    result = run_tessera("serve", "--http-port", "0", "--max-num-seqs", "0", home=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["decoder: --max-num-seqs must be >= 1, got 0"]
    assert not any(marker in result.stdout for marker in LOADING)
    assert not any(tmp_path.iterdir())


def test_a_missing_model_is_one_line_per_service(tmp_path):
    result = run_tessera("serve", "--model", str(tmp_path / "nope"), "--http-port", "0")
    assert result.returncode == 2
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == list(SERVICES)
    assert all("does not exist" in line for line in result.stderr.splitlines())
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def broken_checkpoint(demo_model_dir, tmp_path_factory):
    """Passes every check made before start (a config.json of a supported architecture)
    but holds no tokenizer or weights: each service fails while loading it."""
    directory = tmp_path_factory.mktemp("broken")
    (directory / "config.json").write_text((demo_model_dir / "config.json").read_text())
    return directory


def test_a_failed_load_is_one_line_per_service_without_a_traceback(broken_checkpoint):
    result = run_tessera(
        "serve", "--model", str(broken_checkpoint), "--port", str(free_port()), "--http-port", "0"
    )
    output = result.stdout + result.stderr
    assert result.returncode not in (0, 2), output
    assert "Traceback" not in output
    failed = [s for s in SERVICES if lines_of(result.stderr, f"tessera {s}: could not load")]
    assert failed, output
    for service in SERVICES:
        assert len(lines_of(result.stderr, f"tessera {service}: ")) <= 1, output
    assert lines_of(result.stderr, "tessera serve: the ")[0].endswith("stopping the others")


def test_log_level_debug_adds_the_traceback(broken_checkpoint):
    command = ["decoder", "--model", str(broken_checkpoint), "--port", "0"]
    quiet = run_tessera(*command)
    loud = run_tessera(*command, "--log-level", "debug")
    for result in (quiet, loud):
        assert result.returncode == 1
        assert len(lines_of(result.stderr, "tessera decoder: could not load")) == 1
    assert "Traceback" not in quiet.stderr and "Traceback" in loud.stderr


# -- a running gateway ------------------------------------------------------------------

TEMPLATE = (
    "{% for m in messages %}OVERRIDE {{ m.role }}: {% for c in m.content %}"
    "{% if c.type == 'text' %}{{ c.text }}{% else %}<image>{% endif %}{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}ANSWER:{% endif %}"
)
IMAGE = noise_image(77, 40, 30)


@pytest.fixture(scope="module")
def gateway(cluster, demo_model_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    with http_gateway(
        cluster,
        demo_model_dir,
        "--served-model-name",
        "alpha",
        "beta",
        "--limit-mm-per-prompt",
        '{"image": 1}',
        "--chat-template",
        str(template),
    ) as own:
        yield own


def chat(gateway, content: list, **fields) -> httpx.Response:
    parts = [{"type": "text", "text": p} if isinstance(p, str) else p for p in content]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 2, **fields}
    return httpx.post(gateway.http + "/v1/chat/completions", json=body, timeout=60)


def image_part(data: bytes) -> dict:
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def test_models_lists_the_served_names_and_never_the_path(gateway, demo_model_dir):
    models = httpx.get(gateway.http + "/v1/models")
    assert [m["id"] for m in models.json()["data"]] == ["alpha", "beta"]
    assert str(demo_model_dir) not in models.text and demo_model_dir.name not in models.text
    assert chat(gateway, ["hi"], model="beta").json()["model"] == "beta"
    assert chat(gateway, ["hi"]).json()["model"] == "alpha"
    refused = chat(gateway, ["hi"], model=str(demo_model_dir))
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"


def test_the_json_limit_is_enforced_per_modality(gateway):
    assert chat(gateway, [image_part(IMAGE), "one"]).status_code == 200
    refused = chat(gateway, [image_part(IMAGE), image_part(IMAGE), "two"])
    assert refused.status_code == 400
    assert "2 image items; at most 1 image items" in refused.json()["error"]["message"]


def test_the_chat_template_flag_renders_the_prompt(gateway, demo_model_dir):
    from transformers import AutoProcessor

    with Client(gateway.address("gateway")) as client:
        completion = client.complete(
            [Message("user", [IMAGE, "What?"])], common_pb2.SamplingParams(max_tokens=2)
        )
    # The oracle: the checkpoint's processor rendering the same template.
    processor = AutoProcessor.from_pretrained(demo_model_dir)
    text = processor.apply_chat_template(
        to_template([("user", [IMAGE, "What?"])]),
        chat_template=TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )
    image = Image.open(io.BytesIO(IMAGE))
    expected = processor(text=text, images=[[image]], add_special_tokens=False)["input_ids"][0]
    assert text.startswith("OVERRIDE user:")
    assert list(completion.prompt_token_ids) == list(expected)
    assert "chat_template=--chat-template" in gateway.log_text("gateway")


def test_a_start_line_names_the_resolved_dtype(cluster):
    """--dtype auto (the default) on this float32 checkpoint: float32."""
    assert "dtype=float32" in cluster.log_text("decoder")
    assert "dtype=float32" in cluster.log_text("encoder")
