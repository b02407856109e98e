"""Schemathesis against the gateway's own OpenAPI document, on a real stack: requests
that fit the document and requests that break it in one place each, for every operation.

Each must get no 5xx, a status and content type the document lists, a body that fits the
documented schema (every stream event too), a refusal whenever the request breaks the
document (so the document is no looser than the gateway), and an answer within
REQUEST_TIMEOUT_SECONDS. Afterwards a greedy request is still exactly the model's own
output. Derandomized: CI runs the same examples every time.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from gateway import openai_api
from gateway.choices import MAX_CHOICES
from gateway.openapi import DOCUMENT, OPENAPI_PATH
from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import assert_greedy_match, noise_image

MODEL = "tessera-demo"
# Generous for one tiny-model request on a loaded 2-core machine; only a hang reaches it.
REQUEST_TIMEOUT_SECONDS = 60
# Generated requests run the model: a few tokens each keep the file near a minute.
MAX_GENERATED_TOKENS = 4
# And a few choices each (n up to 16 is valid, but 16 generations per example is slow).
MAX_GENERATED_CHOICES = 2
GENERATING_PATHS = ("/v1/chat/completions", "/v1/completions")
IMAGE = noise_image(2024, 32, 24)
GOOD = {
    "model": MODEL,
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "image_url",
                    "image_url": {
                        "url": "data:image/png;base64," + base64.b64encode(IMAGE).decode()
                    },
                },
                {"type": "text", "text": "Describe it."},
            ],
        }
    ],
    "max_tokens": 8,
    "temperature": 0,
}

schema = schemathesis.openapi.from_dict(DOCUMENT)
# Nothing here is secret, and the default hides every field named like "*token*"
# (max_tokens) from the failure reports.
schema.config.output.sanitization.update(enabled=False)


@pytest.fixture(scope="module")
def gateway(demo_model_dir: Path) -> Iterator[Cluster]:
    """A stack of its own: the fuzz run's load and cache entries touch no other test."""
    own = Cluster()
    port = free_port()
    try:
        own.start_stack(
            demo_model_dir,
            gateway_args=["--http-port", str(port), "--served-model-name", MODEL],
        )
        own.wait_ready()
        own.http = f"http://127.0.0.1:{port}"
        yield own
    finally:
        own.stop()


def good_tokens(http: str, **extra: object) -> list[int]:
    response = httpx.post(
        http + "/v1/chat/completions", json=GOOD | extra, timeout=REQUEST_TIMEOUT_SECONDS
    )
    assert response.status_code == 200, response.text
    return response.json()["tessera"]["token_ids"]


@pytest.fixture(scope="module")
def before_fuzzing(gateway: Cluster) -> list[int]:
    """The good request's tokens on the fresh stack (the fuzz test asks for this first)."""
    return good_tokens(gateway.http)


def test_the_served_document_is_the_one_fuzzed(gateway: Cluster) -> None:
    served = httpx.get(gateway.http + OPENAPI_PATH, timeout=REQUEST_TIMEOUT_SECONDS)
    assert served.status_code == 200
    assert served.json() == DOCUMENT


def _whole(value: object) -> bool:
    """An integer as the document counts them: 4 or 4.0, not true."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def cap_generation(body: object) -> None:
    """Lowers a valid token limit above MAX_GENERATED_TOKENS to it, and sets max_tokens
    where no limit is given (the default runs to the end of the context); lowers a valid
    n above MAX_GENERATED_CHOICES to it. An invalid value is never touched, and only a
    valid one added, so a request that broke the document still does, and one that fit
    it still does."""
    if not isinstance(body, dict):
        return
    n = body.get("n")
    if _whole(n) and MAX_GENERATED_CHOICES < n <= MAX_CHOICES:
        body["n"] = MAX_GENERATED_CHOICES
    names = ("max_completion_tokens", "max_tokens")
    given = [name for name in names if body.get(name) is not None]
    if not given:
        body["max_tokens"] = MAX_GENERATED_TOKENS
    for name in given:
        value = body[name]
        if _whole(value) and MAX_GENERATED_TOKENS < value <= openai_api.MAX_TOKENS_LIMIT:
            body[name] = MAX_GENERATED_TOKENS


@schema.parametrize()
@settings(
    max_examples=100,  # per operation; two of them generate (chat and completions)
    derandomize=True,
    database=None,
    deadline=None,
    # Schemas this nested make Hypothesis retry and filter draws; that is expected here.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_every_operation_survives_generated_requests(
    case: schemathesis.Case, gateway: Cluster, before_fuzzing: list[int]
) -> None:
    if case.path in GENERATING_PATHS:
        cap_generation(case.body)
    # positive_data_acceptance is left out: a request can fit the document and still be
    # refused for what no schema states (a model name not served, a URL host not
    # allowed, bytes that are no image, a prompt beyond the context).
    case.call_and_validate(
        base_url=gateway.http,
        timeout=REQUEST_TIMEOUT_SECONDS,
        excluded_checks=[positive_data_acceptance],
    )


def test_a_good_request_is_still_exact_after_fuzzing(
    gateway: Cluster, before_fuzzing: list[int], reference
) -> None:
    expected = reference.generate([("user", [IMAGE, "Describe it."])], GOOD["max_tokens"])
    assert_greedy_match(before_fuzzing, expected)
    assert good_tokens(gateway.http) == before_fuzzing
    # A salt of its own: a fresh prefill, not the prefix cache's blocks.
    assert good_tokens(gateway.http, cache_salt="after-fuzzing") == before_fuzzing
