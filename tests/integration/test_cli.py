"""The commands a new user runs: `tessera serve`, then `tessera generate`."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tessera.launcher import free_port
from tessera.testbed.reference import assert_greedy_match, noise_image

TESSERA = [sys.executable, "-m", "tessera.cli"]


def run_tessera(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*TESSERA, *args], capture_output=True, text=True, timeout=timeout)


def test_generate_json_matches_generate(cluster, reference, tmp_path):
    image = noise_image(401, 45, 35)
    (tmp_path / "cat.png").write_bytes(image)
    result = run_tessera(
        "generate",
        "--server",
        cluster.address("gateway"),
        "--image",
        str(tmp_path / "cat.png"),
        "--max-tokens",
        "6",
        "--json",
        "describe",
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert set(answer) >= {"text", "token_ids", "prompt_token_ids", "usage", "stats"}
    expected = reference.generate([("user", [image, "describe"])], 6)
    assert answer["prompt_token_ids"] == expected.prompt_token_ids
    assert_greedy_match(answer["token_ids"], expected)
    assert answer["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)
    assert answer["usage"]["completion_tokens"] == 6
    assert answer["stats"]["num_items"] == 1


def test_generate_reports_errors_without_a_traceback(cluster, tmp_path):
    missing = run_tessera(
        "generate", "--server", cluster.address("gateway"), "--image", "nope.png", "hi"
    )
    assert missing.returncode != 0 and "cannot read media" in missing.stderr
    (tmp_path / "bad.png").write_bytes(b"not a png")
    bad = run_tessera(
        "generate",
        "--server",
        cluster.address("gateway"),
        "--image",
        str(tmp_path / "bad.png"),
        "hi",
    )
    assert bad.returncode != 0
    assert "INVALID_ARGUMENT" in bad.stderr and "Traceback" not in bad.stderr


def test_generate_stops_quietly_when_its_reader_has_gone(cluster):
    """`tessera generate ... | head`: the reader closed before the first token was
    printed; no traceback, status 1."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [*TESSERA, "generate", "--server", cluster.address("gateway"), "hi"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr


def test_serve_then_generate_on_a_fresh_home(tmp_path):
    """What the README promises: serve makes the demo model, prints where to connect,
    answers `tessera generate --image`, and stops everything on SIGTERM."""
    port, http_port = free_port(), free_port()
    env = {**os.environ, "TESSERA_HOME": str(tmp_path / "home")}
    serve = subprocess.Popen(
        [
            *TESSERA,
            "serve",
            "--port",
            str(port),
            "--max-chunk-tokens",
            "8",
            "--http-port",
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = serve.stdout.readline()
            assert line, "serve exited early:\n" + "".join(output)
            output.append(line)
            if "stop: Ctrl-C" in line:
                break
        text = "".join(output)
        assert "making the demo model" in text
        assert "max_chunk_tokens=8" in text
        serve_output = serve.stdout
        # Keep draining so the children never block on a full pipe.
        drain = subprocess.Popen(["cat"], stdin=serve_output, stdout=subprocess.DEVNULL)
        (tmp_path / "some.png").write_bytes(noise_image(402, 30, 30))
        result = run_tessera(
            "generate",
            "--server",
            f"127.0.0.1:{port}",
            "--image",
            str(tmp_path / "some.png"),
            "describe",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
        # The OpenAI-compatible API is up too, on the port the ready message names.
        assert f"http://127.0.0.1:{http_port}/v1" in text
        image = base64.b64encode(noise_image(403, 30, 30)).decode()
        body = {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{image}"},
                        },
                        {"type": "text", "text": "describe"},
                    ],
                }
            ],
            "max_tokens": 4,
        }
        answer = httpx.post(
            f"http://127.0.0.1:{http_port}/v1/chat/completions", json=body, timeout=60
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
        assert (Path(env["TESSERA_HOME"]) / "demo-tiny" / "config.json").exists()
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0
    drain.wait(10)


def test_make_demo_model(tmp_path):
    result = run_tessera("make-demo-model", str(tmp_path / "m"), "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "m" / "config.json").exists() and (
        tmp_path / "m" / "tokenizer.json"
    ).exists()


def test_make_demo_model_of_another_family(tmp_path):
    result = run_tessera("make-demo-model", str(tmp_path / "q"), "--family", "qwen2.5-vl")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    refused = run_tessera("make-demo-model", str(tmp_path / "x"), "--family", "nope")
    assert refused.returncode != 0 and "invalid choice" in refused.stderr


def test_serve_takes_a_model_or_a_demo_family(tmp_path):
    refused = run_tessera("serve", "--model", "m", "--family", "gemma3")
    assert refused.returncode != 0 and "not both" in refused.stderr
    from tessera.cli import default_demo_dir, ensure_demo_model

    made = ensure_demo_model(tmp_path / "demo", "gemma3")
    config = json.loads((made / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert default_demo_dir("gemma3") != default_demo_dir()
