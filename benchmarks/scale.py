"""How many requests each suite sends (`--quick`, under five minutes on 2 cores, or full),
and the image sides the workloads draw."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.workloads import Spec

# Image sides (min, max) in px drawn by the workloads, by family: dynamic-resolution
# families get images from 200 px to 1500 px (Qwen2.5-VL bench: ~50 to ~2500 rows).
IMAGE_SIDES = {name: (200, 1500) for name in ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe")}
DEFAULT_IMAGE_SIDES = (96, 320)


@dataclass(frozen=True)
class Scale:
    cells: list[tuple[Spec, int]]  # closed-loop workloads and their client concurrency
    chunk_sizes: list[int]
    chunk_requests: int
    chunk_images: int
    poisson_requests: int
    poisson_rate: float
    latency_chunks: list[int]
    latency_long_prompts: int
    wire_copies: int
    wire_repeats: int
    growth_repeats: int
    growth_values: dict[str, tuple[int, ...]]
    fleet_requests: int
    fleet_pool: int
    fleet_verify_every: int
    batching_items: int
    disagg_requests: int


def _cells(
    c1: int, c4: int, c16: int, zero: int, two: int, convs: int, turns: int, four: int, out
) -> list[tuple[Spec, int]]:
    cells = [
        (Spec("reuse80-c1", c1, 1, 0.8, output_tokens=out, seed=101), 1),
        (Spec("reuse80-c4", c4, 1, 0.8, output_tokens=out, seed=102), 4),
        (Spec("reuse80-c16", c16, 1, 0.8, output_tokens=out, seed=103), 16),
        (Spec("reuse0-c4", zero, 1, 0.0, output_tokens=out, seed=104), 4),
        (Spec("reuse50-2img-c4", two, 2, 0.5, output_tokens=out, seed=105), 4),
        (
            Spec(
                "multiturn-c4",
                convs * turns,
                1,
                0.0,
                text_words=(16, 48),
                output_tokens=(16, 32),
                seed=106,
                turns=turns,
            ),
            convs,
        ),
    ]
    if four:
        cells.append(
            (
                Spec(
                    "reuse50-4img-c4",
                    four,
                    4,
                    0.5,
                    text_words=(64, 256),
                    output_tokens=out,
                    seed=107,
                ),
                4,
            )
        )
    return cells


QUICK = Scale(
    cells=_cells(c1=4, c4=8, c16=16, zero=4, two=4, convs=2, turns=2, four=0, out=(16, 16)),
    chunk_sizes=[16, 256],
    chunk_requests=2,
    chunk_images=1,
    poisson_requests=8,
    poisson_rate=1.5,
    latency_chunks=[0, 128],
    latency_long_prompts=1,
    wire_copies=32,
    wire_repeats=3,
    growth_repeats=1,
    growth_values={"images": (1, 4), "side": (64, 1536), "words": (16, 1024)},
    fleet_requests=16,
    fleet_pool=4,
    fleet_verify_every=8,
    batching_items=32,
    disagg_requests=8,
)

FULL = Scale(
    cells=_cells(c1=8, c4=32, c16=64, zero=32, two=8, convs=4, turns=3, four=8, out=(16, 64)),
    chunk_sizes=[16, 32, 64, 128, 256],
    chunk_requests=3,
    chunk_images=2,
    poisson_requests=24,
    poisson_rate=1.5,
    latency_chunks=[0, 128, 32],
    latency_long_prompts=3,
    wire_copies=64,
    wire_repeats=5,
    # The 1536-over-512 px TTFT overhead is read off this table: with medians of 2
    # requests it read 300 ms for the plaintext arm in one run, 176 ms with 8 the next.
    growth_repeats=8,
    growth_values={"images": (1, 2, 4), "side": (64, 512, 1536), "words": (16, 256, 1024)},
    fleet_requests=120,
    fleet_pool=24,
    fleet_verify_every=5,
    batching_items=64,
    disagg_requests=16,
)
