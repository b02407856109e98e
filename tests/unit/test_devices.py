"""What counts as a tie in each dtype (tessera.testbed.devices): the exactness tests
accept a greedy difference only there, so these bounds decide what a GPU run may pass."""

from __future__ import annotations

import pytest
import torch

from tessera.testbed.devices import RunOn
from tessera.testbed.reference import NEAR_TIES, ReferenceOutput, assert_greedy_match


def test_float32_keeps_its_absolute_bounds_and_default_services_get_no_flags():
    run_on = RunOn()
    assert run_on.near_tie(10.0) == 1e-5 and run_on.logprob_tolerance(10.0) == 1e-4
    assert run_on.service_args() == []
    gpu = RunOn("cuda", "bfloat16")
    assert gpu.service_args() == ["--device", "cuda", "--dtype", "bfloat16"]
    with pytest.raises(ValueError, match="choose from"):
        RunOn("cuda", "int8")


def test_half_precision_ties_are_a_few_ulps_of_the_logits_size():
    bf16, fp16 = RunOn("cuda", "bfloat16"), RunOn("cuda", "float16")
    assert bf16.ulp(10.0) == 0.0625  # bfloat16 values in [8, 16) are 1/16 apart
    assert bf16.ulp(-10.0) == bf16.ulp(10.0) and bf16.ulp(0.01) == bf16.ulp(1.0)
    assert fp16.ulp(10.0) == 2**-7
    assert bf16.near_tie(10.0) == 4 * 0.0625
    assert bf16.near_tie(40.0) == 4 * bf16.near_tie(10.0)  # larger logits, coarser steps


def reference_with_gap(gap: float, run_on: RunOn) -> ReferenceOutput:
    logits = torch.zeros(8)
    logits[3], logits[5] = 10.0, 10.0 - gap
    return ReferenceOutput([1], [3], [logits], run_on)


@pytest.mark.parametrize(("dtype", "gap", "tie"), [
    ("float32", 5e-6, True), ("float32", 0.01, False),
    ("bfloat16", 0.0625, True), ("bfloat16", 0.5, False),
])  # fmt: skip
def test_a_greedy_difference_passes_only_at_a_tie_of_the_run_dtype(dtype, gap, tie):
    reference = reference_with_gap(gap, RunOn("cpu", dtype))
    recorded = len(NEAR_TIES)
    try:
        if tie:
            assert assert_greedy_match([5], reference, "test") is True
        else:
            with pytest.raises(AssertionError, match="not a near-tie"):
                assert_greedy_match([5], reference, "test")
    finally:
        del NEAR_TIES[recorded:]  # made up: not for the session's report of real ones
