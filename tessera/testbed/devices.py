"""Where the exactness tests run: one device and dtype for the services and the oracle
alike (`pytest --tessera-device cuda --tessera-dtype bfloat16`, scripts/gpu_check.sh).

In float32 Tessera's packed, chunked forward and generate()'s one-shot forward differ
by ~1e-6 in a logit, so greedy tokens must be identical except at a true tie. In
bfloat16 or float16 both sides round to 8 (or 11) significant bits, in different orders
(chunk boundaries, paged attention, other kernels), so their logits differ by a few
units in the last place (ulps) of the logits' size: a greedy difference is then a bug
only where the reference's top two logits are further apart than that. Comparing a
bfloat16 run with a float32 generate() would mix that noise with the dtype's own change
of answer, so the oracle runs in the same dtype on the same device.

Measured on the demo checkpoints of LLaVA, Qwen2.5-VL, Qwen3-VL and Gemma 3 in bfloat16
on a CPU (top logits of 11-17, where a bfloat16 ulp is 0.0625 or 0.125): over 4 prompts
x 12 steps x chunks of 3, 16 and all, the services' log-probabilities differed from
generate()'s by at most 0.125 (2 ulps), mostly where chunk boundaries differ from
generate()'s one pass; greedy tokens differed only at reference gaps of 0 or 1 ulp.
HALF_PRECISION_ULPS doubles that for other kernels; a first GPU run's accepted
near-ties (listed at the end of the test run) show how close it comes. The price: the
demo checkpoints' random weights often put their top two logits within a few ulps, so a
half-precision run proves less than a float32 one, which stays the exactness check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Float32: Tessera's packed/chunked attention and the one-shot one differ by ~1e-6.
FLOAT32_NEAR_TIE = 1e-5
FLOAT32_LOGPROB_TOLERANCE = 1e-4
# Half precision: two logits within this many ulps of the larger are a tie (see above).
HALF_PRECISION_ULPS = 4
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class RunOn:
    """A device (`cpu`, `cuda`, `cuda:1`) and a dtype name from DTYPES."""

    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: choose from {', '.join(DTYPES)}")

    @property
    def is_default(self) -> bool:
        return (self.device, self.dtype) == ("cpu", "float32")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def near_tie(self, top_logit: float) -> float:
        """How close the reference's top two logits (the larger `top_logit`) must be for
        a greedy difference there to be a tie, not a bug."""
        if self.torch_dtype == torch.float32:
            return FLOAT32_NEAR_TIE
        return HALF_PRECISION_ULPS * self.ulp(top_logit)

    def logprob_tolerance(self, top_logit: float) -> float:
        """How far a log-probability may be from the reference's at one step."""
        if self.torch_dtype == torch.float32:
            return FLOAT32_LOGPROB_TOLERANCE
        return HALF_PRECISION_ULPS * self.ulp(top_logit)

    def ulp(self, value: float) -> float:
        """The dtype's spacing at `value` (at least at 1): bfloat16 at 10 -> 0.0625."""
        spacing_at_one = torch.finfo(self.torch_dtype).eps
        return spacing_at_one * 2.0 ** math.floor(math.log2(max(1.0, abs(value))))

    def service_args(self) -> list[str]:
        """Flags for every service; none for the default, so CPU runs start the
        services exactly as a user's `tessera serve` would."""
        return [] if self.is_default else ["--device", self.device, "--dtype", self.dtype]
