"""The throughput ceiling's arithmetic (benchmarks/ceiling.py), on its worked example."""

from __future__ import annotations

import pytest

from benchmarks.ceiling import PartCosts, ceiling

COSTS = PartCosts(
    vision_ms=20.0,
    prefill_ms=55.0,
    generate_prefill_ms=55.0,
    generate_token_ms=3.3,
    step_ms={1: 3.6, 4: 5.0},
)


def test_worked_example():
    # generate(): 20 + 55 + 40 x 3.3 = 207 ms a request.
    assert ceiling(COSTS, reuse=0.8, clients=4, output_tokens=40) == pytest.approx(207 / 109)
    assert ceiling(COSTS, reuse=0.0, clients=4, output_tokens=40) == pytest.approx(207 / 125)


def test_one_client_gains_only_from_cached_images_and_a_cheaper_step():
    assert ceiling(COSTS, reuse=0.0, clients=1, output_tokens=40) == pytest.approx(
        207 / (20 + 55 + 40 * 3.6)
    )
