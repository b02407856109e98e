"""The most any server could get out of this machine's cores, cell by cell: a throughput
ceiling against `generate()` built from the parts' own costs, each measured alone.

On a CPU a vision pass and a prefill cost about the same per token whether one request or
several share the forward (their matmuls are compute-bound and already use every core);
only decode steps batch. So however it schedules, a server spends on a request at least

    new_fraction x vision + prefill(prompt) + output_tokens x step(c) / c

where `step(c)` is the decoder engine's step with `c` requests decoding, while
`generate()` spends `vision + prefill + output_tokens x token` on every request. The
ratio of the two is the ceiling of `tessera / generate()` throughput in a closed-loop
cell of `c` clients, on these cores, before any RPC, tokenizer or scheduling cost.

Worked example: vision 20 ms, prefill 55 ms, 40 output tokens, `generate()` token 3.3 ms,
step(4) 5.0 ms. `generate()`: 20 + 55 + 132 = 207 ms a request. With 80% of images
cached: 4 + 55 + 50 = 109 ms, a ceiling of 1.90x; with none cached 20 + 55 + 50 = 125 ms,
1.66x.

    python -m benchmarks.ceiling [--model DIR] [--prompt-tokens 320] [--output-tokens 40]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.common import bench_model, markdown_table
from benchmarks.step import (
    NUM_DECODE_TOKENS,
    engine_forward_seconds,
    generate_timer,
    load_language_model,
    prompts,
    tessera_step,
)
from tessera.adapters import LoadOptions, MediaInput, ModelPart, load_family
from tessera.compute_thread import compute_thread
from tessera.media import decode_image
from tessera.testbed.media import noise_image

# (cell, share of images already encoded, clients, the target).
CELLS = [
    ("reuse80-c1", 0.8, 1, None),
    ("reuse80-c4", 0.8, 4, 2.0),
    ("reuse80-c16", 0.8, 16, 3.0),
    ("reuse0-c4", 0.0, 4, 1.3),
]


@dataclass(frozen=True)
class PartCosts:
    """Milliseconds of each part, alone, on every core of this machine."""

    vision_ms: float  # one image's vision pass (the encoder's own `encode`)
    prefill_ms: float  # the decoder engine's prefill of one prompt
    generate_prefill_ms: float  # generate()'s prefill of the same prompt
    generate_token_ms: float  # generate()'s cost per output token
    step_ms: dict[int, float]  # the engine's decode step, by requests decoding


def timed(function: Callable, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def best_ms(seconds: Callable[[], float], repeats: int) -> float:
    return min(seconds() for _ in range(repeats)) * 1000  # the least disturbed by other work


def vision_ms(model: str, repeats: int) -> float:
    family = load_family(model, LoadOptions(ModelPart.PROCESSOR | ModelPart.MEDIA_ENCODER))
    images = [MediaInput(decode_image(noise_image(seed, 224, 224))) for seed in range(repeats)]
    family.encode(images[:1])  # warm-up
    return statistics.median(timed(family.encode, [image]) * 1000 for image in images)


def generate_costs(model: str, prompt_tokens: int, repeats: int) -> tuple[float, float]:
    """generate()'s prefill (one token out) and its cost per further token, in ms."""
    seconds = generate_timer(model, prompt_tokens)
    prefill = best_ms(lambda: seconds(1), repeats)
    tokens = 1 + NUM_DECODE_TOKENS
    return prefill, (best_ms(lambda: seconds(tokens), repeats) - prefill) / NUM_DECODE_TOKENS


def measure(model: str, prompt_tokens: int, batch_sizes: list[int], repeats: int) -> PartCosts:
    # Every torch op on the one compute thread, as the services run them; the engine
    # (tessera_step) hands its own work to that thread, so this runs beside it.
    compute = compute_thread()
    family = load_language_model(model)
    token_ids = prompts(1, prompt_tokens, family.vocab_size)
    engine_forward_seconds(family, model, token_ids, 0)  # warm-up
    prefill = min(engine_forward_seconds(family, model, token_ids, 0) for _ in range(repeats))
    steps = {c: tessera_step(family, model, c, prompt_tokens, repeats) * 1000 for c in batch_sizes}
    generate_prefill, generate_token = compute.call(generate_costs, model, prompt_tokens, repeats)
    vision = compute.call(vision_ms, model, repeats)
    return PartCosts(vision, prefill * 1000, generate_prefill, generate_token, steps)


def ceiling(costs: PartCosts, reuse: float, clients: int, output_tokens: float) -> float:
    """The ceiling of tessera / generate() throughput for one closed-loop cell."""
    generate = costs.vision_ms + costs.generate_prefill_ms + output_tokens * costs.generate_token_ms
    server = (1 - reuse) * costs.vision_ms + costs.prefill_ms
    server += output_tokens * costs.step_ms[clients] / clients
    return generate / server


def table(costs: PartCosts, output_tokens: float, measured: dict[str, float]) -> str:
    rows = []
    for name, reuse, clients, target in CELLS:
        bound = ceiling(costs, reuse, clients, output_tokens)
        rows.append(
            [
                name,
                f"{bound:.2f}x",
                f"{target:.1f}x" if target else "-",
                f"{measured[name]:.2f}x" if name in measured else "-",
            ]
        )
    return markdown_table(["cell", "ceiling", "target", "measured"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-tokens", type=int, default=320)
    parser.add_argument("--output-tokens", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--measured",
        nargs="*",
        default=[],
        metavar="CELL=RATIO",
        help="measured tessera / generate() ratios to print beside the ceilings",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    model = compute_thread().call(bench_model, args.model, "llava")
    batch_sizes = sorted({clients for _, _, clients, _ in CELLS})
    costs = measure(model, args.prompt_tokens, batch_sizes, args.repeats)
    print(
        f"vision {costs.vision_ms:.1f} ms, prefill {costs.prefill_ms:.1f} ms (generate() "
        f"{costs.generate_prefill_ms:.1f}), generate() token {costs.generate_token_ms:.2f} ms, "
        + ", ".join(f"step({c}) {ms:.2f} ms" for c, ms in costs.step_ms.items())
    )
    measured = {cell: float(ratio) for cell, ratio in (m.split("=") for m in args.measured)}
    print(table(costs, args.output_tokens, measured))


if __name__ == "__main__":
    main()
