#!/usr/bin/env bash
# GPU readiness: where the machine has an NVIDIA GPU, run the exactness tests and a
# short benchmark on it in bfloat16, every output compared with generate() run in the
# same dtype on the same device (tessera.testbed.devices says what counts as a tie
# there). Where it has none, print SKIPPED and why, and exit 0: nothing is reported as
# checked that did not run.
#
#   bash scripts/gpu_check.sh                           # cuda, bfloat16
#   GPU_CHECK_DEVICE=cuda:1 GPU_CHECK_DTYPE=float16 bash scripts/gpu_check.sh
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh      # the same checks on the CPU:
#                                                       # a run of this script, not a GPU check
#
# Exit status: 0 when every check passed or the whole run was skipped (the last line
# says which), non-zero when a check failed or a GPU is there but cannot be used.
set -euo pipefail

cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
device=${GPU_CHECK_DEVICE:-cuda}
dtype=${GPU_CHECK_DTYPE:-bfloat16}
out=${GPU_CHECK_OUT:-gpu-check-results}

say() { echo "gpu_check: $*"; }

skip() {
    say "SKIPPED: $1."
    say "SKIPPED: nothing was checked: neither the exactness tests nor the benchmark ran on a GPU."
    exit 0
}

# How many GPUs the machine has, asked without Python: a machine without one skips
# even where no environment is set up.
count_gpus() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
    else
        find /dev -maxdepth 1 -name 'nvidia[0-9]*' 2>/dev/null | wc -l
    fi
}

if [[ $device == cuda* && $(count_gpus) -eq 0 ]]; then
    if command -v nvidia-smi >/dev/null 2>&1; then
        skip "no NVIDIA GPU on this machine (nvidia-smi lists none)"
    fi
    skip "no NVIDIA GPU on this machine (no nvidia-smi, no /dev/nvidia* device)"
fi

# From here on there is something to check: a missing environment is a failure.
if [[ ! -x $python ]]; then
    say "FAILED: no Python at $python (run 'make venv', or set PYTHON)" >&2
    exit 1
fi

if [[ $device == cuda* ]]; then
    # A GPU the checks cannot use fails them: skipping would pass what did not run.
    if ! "$python" -c '
import sys

import torch

if torch.version.cuda is None:
    sys.exit(f"torch {torch.__version__} is a CPU-only build (README, On a GPU: install the CUDA one)")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the GPU")
'; then
        say "FAILED: this machine has a GPU, but torch cannot use it (above)" >&2
        exit 1
    fi
    where=$("$python" -c "import torch; print(torch.cuda.get_device_name(torch.device('$device')))")
else
    where="$device (GPU_CHECK_DEVICE: not a GPU check)"
fi
say "checking on $where in $dtype"

say "1/2 exactness: greedy tokens equal to generate() in $dtype on $device"
"$python" -m pytest -q -p no:cacheprovider \
    tests/service/test_equivalence.py tests/service/test_families.py \
    -k "test_greedy_tokens_equal_generate" \
    --tessera-device "$device" --tessera-dtype "$dtype"

say "2/2 benchmark: generate() and Tessera side by side (--quick, suites arms and growth)"
"$python" -m benchmarks.run --quick --suites arms growth \
    --device "$device" --dtype "$dtype" --out "$out"

say "PASSED on $where in $dtype: exactness tests and benchmark; figures in $out/results.md"
