"""The host's bounds (benchmarks/ceiling.py): the throughput ceiling and the burst's TTFT
floor, on their worked examples; and the per-token cost they and the step suite read
(benchmarks/step.py)."""

from __future__ import annotations

import pytest

from benchmarks.ceiling import Burst, PartCosts, burst_floor_ms, ceiling, first_burst
from benchmarks.scale import FULL, QUICK
from benchmarks.step import NUM_DECODE_TOKENS, token_costs

COSTS = PartCosts(
    vision_ms=20.0,
    prefill_ms=55.0,
    generate_prefill_ms=55.0,
    generate_token_ms=3.3,
    step_ms={1: 3.6, 4: 5.0},
    vision_one_thread_ms=35.0,
    prefill_one_thread_ms=100.0,
    num_cpus=2,
)


def test_worked_example():
    # generate(): 20 + 55 + 40 x 3.3 = 207 ms a request.
    assert ceiling(COSTS, reuse=0.8, clients=4, output_tokens=40) == pytest.approx(207 / 109)
    assert ceiling(COSTS, reuse=0.0, clients=4, output_tokens=40) == pytest.approx(207 / 125)


def test_one_client_gains_only_from_cached_images_and_a_cheaper_step():
    assert ceiling(COSTS, reuse=0.0, clients=1, output_tokens=40) == pytest.approx(
        207 / (20 + 55 + 40 * 3.6)
    )


FLOOR_COSTS = PartCosts(
    vision_ms=54.0,
    prefill_ms=53.0,
    generate_prefill_ms=50.0,
    generate_token_ms=6.5,
    step_ms={},
    vision_one_thread_ms=90.0,
    prefill_one_thread_ms=100.0,
    num_cpus=2,
)


def test_burst_floor_worked_example():
    # An image: min(90, 2 x 54) = 90 CPU-ms; a prefill: min(100, 2 x min(53, 50)) = 100.
    floor = burst_floor_ms(FLOOR_COSTS, Burst(num_prompts=16, num_new_images=10))
    assert floor == pytest.approx((10 * 90 + 16 * 100) / 2)


def test_burst_floor_counts_a_part_at_its_cheaper_cpu_time():
    """Where two threads cost less CPU than one (they never should, but a noisy minute
    can read so), the floor takes the cheaper: it must stay a lower bound."""
    costs = PartCosts(**{**vars(FLOOR_COSTS), "vision_ms": 30.0, "generate_prefill_ms": 40.0})
    floor = burst_floor_ms(costs, Burst(num_prompts=16, num_new_images=10))
    assert floor == pytest.approx((10 * 60 + 16 * 80) / 2)


def test_burst_floor_grows_with_new_images_and_shrinks_with_cores():
    fewer = burst_floor_ms(FLOOR_COSTS, Burst(16, 2))
    more = burst_floor_ms(FLOOR_COSTS, Burst(16, 12))
    assert more - fewer == pytest.approx(10 * 90 / 2)
    four_cpus = PartCosts(**{**vars(FLOOR_COSTS), "num_cpus": 4})
    # On 4 CPUs the parts' CPU time is still one thread's (the cheaper), spread over 4.
    assert burst_floor_ms(four_cpus, Burst(16, 10)) == pytest.approx((10 * 90 + 16 * 100) / 4)


def test_the_burst_is_the_runs_first_group_of_sixteen():
    # The full run's reuse80-c16 draws 13 distinct images over its 64 requests; 10 of
    # them are among the first 16 (a run of that burst had the encoder compute 10).
    assert first_burst(FULL.cells, (96, 320)) == Burst(num_prompts=16, num_new_images=10)
    # --quick: one group of 16 requests, 3 distinct images (20% of 16).
    assert first_burst(QUICK.cells, (96, 320)) == Burst(num_prompts=16, num_new_images=3)


def test_token_costs_takes_the_best_of_each_run_length_not_the_best_difference():
    """The docstring's example: the short runs' best is 40 ms, the long runs' 196 ms."""
    times = iter([0.040, 0.200, 0.041, 0.196, 0.044, 0.230])  # alternating 1, 33 tokens
    asked = []

    def seconds(num_tokens: int) -> float:
        asked.append(num_tokens)
        return next(times)

    costs = token_costs(seconds, repeats=3)
    assert asked == [1, 1 + NUM_DECODE_TOKENS] * 3
    assert costs.prefill_seconds == pytest.approx(0.040)
    assert costs.token_seconds == pytest.approx((0.196 - 0.040) / NUM_DECODE_TOKENS)
