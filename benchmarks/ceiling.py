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

The same parts give a floor for the time to first token of a burst of prompts that
arrive together (the reuse80-c16 cell's first 16 requests, most of whose images are
new): before its last prompt's first token, every prompt of the burst has been
prefilled and every new image decoded, processed and through the tower, and no schedule
makes that work take less than its CPU time over the cores (`burst_floor_ms`). With
nearest-rank percentiles the cell's TTFT p99 over 64 requests is its largest TTFT, and
the first burst's last first token is the largest.

    python -m benchmarks.ceiling [--model DIR] [--prompt-tokens 320] [--output-tokens 40]
                                 [--burst PROMPTS NEW_IMAGES] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.common import bench_model, markdown_table
from benchmarks.scale import DEFAULT_IMAGE_SIDES, FULL
from benchmarks.step import (
    engine_forward_seconds,
    generate_timer,
    load_language_model,
    prompts,
    tessera_step,
    token_costs,
)
from benchmarks.workloads import Spec, requests_for
from tessera.adapters import LoadOptions, MediaInput, ModelFamily, ModelPart, load_family
from tessera.compute_thread import compute_thread
from tessera.cpus import usable_cpus
from tessera.media import decode_image
from tessera.testbed.media import noise_image

# (cell, share of images already encoded, clients, the target).
CELLS = [
    ("reuse80-c1", 0.8, 1, None),
    ("reuse80-c4", 0.8, 4, 2.0),
    ("reuse80-c16", 0.8, 16, 3.0),
    ("reuse0-c4", 0.0, 4, 1.3),
]
BURST_CELL = "reuse80-c16"  # its first group of requests is the burst of the TTFT floor


@dataclass(frozen=True)
class PartCosts:
    """Milliseconds of each part, alone; on every core of this machine unless named."""

    vision_ms: float  # one image: its file decoded, processed and through the tower
    prefill_ms: float  # the decoder engine's prefill of one prompt
    generate_prefill_ms: float  # generate()'s prefill of the same prompt
    generate_token_ms: float  # generate()'s cost per output token
    step_ms: dict[int, float]  # the engine's decode step, by requests decoding
    # The image and the prefill again on one torch thread: beside other work (a burst's
    # encodes and prefills run side by side) a part costs the cores no more CPU time
    # than this, nor more than its time on every core times the cores.
    vision_one_thread_ms: float
    prefill_one_thread_ms: float
    num_cpus: int

    def cpu_ms(self, every_core_ms: float, one_thread_ms: float) -> float:
        """The least CPU time the part is known to need."""
        return min(one_thread_ms, every_core_ms * self.num_cpus)


@dataclass(frozen=True)
class Burst:
    """Prompts arriving together, and how many distinct images among them are new."""

    num_prompts: int
    num_new_images: int


def timed(function: Callable, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


def load_vision(model: str) -> ModelFamily:
    return load_family(model, LoadOptions(ModelPart.PROCESSOR | ModelPart.MEDIA_ENCODER))


def vision_ms(family: ModelFamily, repeats: int) -> float:
    """One 224 px image's file decoded, processed and encoded, in ms: the fastest of
    `repeats` images (on the calling thread's torch threads; other work only adds)."""
    files = [noise_image(seed, 224, 224) for seed in range(repeats)]
    family.encode([MediaInput(decode_image(files[0]))])  # warm-up

    def image(data: bytes) -> float:
        return timed(lambda: family.encode([MediaInput(decode_image(data))])) * 1000

    return min(image(data) for data in files)


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """The compute thread's torch ops on one thread inside, as many as before after."""
    compute = compute_thread()
    before = compute.call(torch.get_num_threads)
    compute.call(torch.set_num_threads, 1)
    try:
        yield
    finally:
        compute.call(torch.set_num_threads, before)


def measure(model: str, prompt_tokens: int, batch_sizes: list[int], repeats: int) -> PartCosts:
    # Every torch op on the one compute thread, as the services run them; the engine
    # (tessera_step) hands its own work to that thread, so this runs beside it.
    compute = compute_thread()
    family = load_language_model(model)
    token_ids = prompts(1, prompt_tokens, family.vocab_size)

    def prefill_ms(*flags: str) -> float:
        engine_forward_seconds(family, model, token_ids, 0, flags)  # warm-up
        runs = (engine_forward_seconds(family, model, token_ids, 0, flags) for _ in range(repeats))
        return min(runs) * 1000

    vision = compute.call(load_vision, model)
    with one_torch_thread():  # and no thread governor to raise it (--torch-threads 1)
        prefill_one_thread = prefill_ms("--torch-threads", "1")
        vision_one_thread = compute.call(vision_ms, vision, repeats)
    prefill = prefill_ms()
    steps = {c: tessera_step(family, model, c, prompt_tokens, repeats) * 1000 for c in batch_sizes}
    # generate() loads its model and runs on the compute thread too.
    generate = compute.call(lambda: token_costs(generate_timer(model, prompt_tokens), repeats))
    return PartCosts(
        vision_ms=compute.call(vision_ms, vision, repeats),
        prefill_ms=prefill,
        generate_prefill_ms=generate.prefill_seconds * 1000,
        generate_token_ms=generate.token_seconds * 1000,
        step_ms=steps,
        vision_one_thread_ms=vision_one_thread,
        prefill_one_thread_ms=prefill_one_thread,
        num_cpus=usable_cpus(),
    )


def ceiling(costs: PartCosts, reuse: float, clients: int, output_tokens: float) -> float:
    """The ceiling of tessera / generate() throughput for one closed-loop cell."""
    generate = costs.vision_ms + costs.generate_prefill_ms + output_tokens * costs.generate_token_ms
    server = (1 - reuse) * costs.vision_ms + costs.prefill_ms
    server += output_tokens * costs.step_ms[clients] / clients
    return generate / server


def burst_floor_ms(costs: PartCosts, burst: Burst) -> float:
    """The earliest the last first token of `burst` can come, in ms after it arrives: its
    new images and all its prefills, at their least CPU time, spread over every core
    with nothing lost (the cheaper of the engine's and generate()'s prefill per prompt).

    Worked example: 16 prompts, 10 new images, 2 CPUs; an image 90 ms on one thread and
    54 on two (108 CPU-ms: 90 counts), a prefill 100 ms on one thread and 53 on two
    (106: 100 counts; generate()'s 50 on two, 100: 100) -> (10 x 90 + 16 x 100) / 2 =
    1250 ms.
    """
    image = costs.cpu_ms(costs.vision_ms, costs.vision_one_thread_ms)
    prefill_every_core = min(costs.prefill_ms, costs.generate_prefill_ms)
    prefill = costs.cpu_ms(prefill_every_core, costs.prefill_one_thread_ms)
    return (burst.num_new_images * image + burst.num_prompts * prefill) / costs.num_cpus


def ceilings(costs: PartCosts, output_tokens: float) -> dict[str, float]:
    return {
        name: ceiling(costs, reuse, clients, output_tokens) for name, reuse, clients, _ in CELLS
    }


def table(ceilings_by_cell: dict[str, float], measured: dict[str, float]) -> str:
    rows = [
        [
            name,
            f"{ceilings_by_cell[name]:.2f}x",
            f"{target:.1f}x" if target else "-",
            f"{measured[name]:.2f}x" if name in measured else "-",
        ]
        for name, _, _, target in CELLS
    ]
    return markdown_table(["cell", "ceiling", "target", "measured"], rows)


def first_burst(cells: list[tuple[Spec, int]], image_sides: tuple[int, int]) -> Burst:
    """The burst of the TTFT floor: `BURST_CELL`'s first group of requests among a run's
    `cells` (benchmarks.scale), drawn at the run's image sides. Its distinct images are
    all new: every run draws fresh ones."""
    spec, clients = next((s, c) for s, c in cells if s.name == BURST_CELL)
    group = requests_for(replace(spec, image_side=image_sides))[:clients]
    return Burst(len(group), len({item for request in group for item in request.items}))


def summary(costs: PartCosts, output_tokens: float, burst: Burst) -> str:
    return (
        f"vision {costs.vision_ms:.1f} ms ({costs.vision_one_thread_ms:.1f} on one thread), "
        f"prefill {costs.prefill_ms:.1f} ms ({costs.prefill_one_thread_ms:.1f} on one thread; "
        f"generate() {costs.generate_prefill_ms:.1f}), generate() token "
        f"{costs.generate_token_ms:.2f} ms, "
        + ", ".join(f"step({c}) {ms:.2f} ms" for c, ms in costs.step_ms.items())
        + f"; TTFT floor of a burst of {burst.num_prompts} prompts with "
        f"{burst.num_new_images} new images on {costs.num_cpus} CPUs: "
        f"{burst_floor_ms(costs, burst):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-tokens", type=int, default=320)
    parser.add_argument("--output-tokens", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--burst",
        type=int,
        nargs=2,
        metavar=("PROMPTS", "NEW_IMAGES"),
        help=f"the TTFT floor's burst (default: {BURST_CELL}'s first, at the run's image sides)",
    )
    parser.add_argument(
        "--measured",
        nargs="*",
        default=[],
        metavar="CELL=RATIO",
        help="measured tessera / generate() ratios to print beside the ceilings",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = compute_thread().call(bench_model, args.model, "llava")
    batch_sizes = sorted({clients for _, _, clients, _ in CELLS})
    costs = measure(model, args.prompt_tokens, batch_sizes, args.repeats)
    burst = Burst(*args.burst) if args.burst else first_burst(FULL.cells, DEFAULT_IMAGE_SIDES)
    print(summary(costs, args.output_tokens, burst))
    measured = {cell: float(ratio) for cell, ratio in (m.split("=") for m in args.measured)}
    bounds = ceilings(costs, args.output_tokens)
    print(table(bounds, measured))
    if args.json:
        figures = {
            "costs": asdict(costs),
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "ceilings": bounds,
            "burst": asdict(burst),
            "burst_floor_ms": burst_floor_ms(costs, burst),
            "summary": summary(costs, args.output_tokens, burst),
        }
        args.json.write_text(json.dumps(figures))


if __name__ == "__main__":
    main()
