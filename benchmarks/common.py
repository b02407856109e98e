"""What every benchmark shares: the checkpoint, seeded requests, services, progress."""

from __future__ import annotations

import random
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import Cluster
from tests.reference import noise_image

WORDS = [
    *("a", "red", "cat", "sits", "on", "the", "old", "blue", "chair", "near"),
    *("one", "small", "window", "while", "birds", "fly"),
]

Prompt = list[tuple[str, list[str | bytes]]]


def bench_model(model: str | None) -> str:
    """The given checkpoint, or a fresh `bench` demo model."""
    if model:
        return model
    from tessera.demo_model import make_demo_model

    print("making the bench demo model")
    directory = Path(tempfile.mkdtemp(prefix="tessera-bench-")) / "bench"
    return str(make_demo_model(directory, seed=0, size="bench"))


@dataclass(frozen=True)
class Workload:
    """Seeded chat requests: `num_images` images each, drawn from a pool of
    `num_distinct_images` (reuse = 1 - distinct / (requests * images))."""

    num_requests: int
    num_distinct_images: int
    num_images: int
    num_text_words: int
    max_tokens: int
    seed: int

    def prompts(self) -> list[Prompt]:
        rng = random.Random(self.seed)
        pool = [
            noise_image(self.seed * 1000 + i, 64 + i % 50, 48 + i % 40)
            for i in range(self.num_distinct_images)
        ]
        prompts = []
        for _ in range(self.num_requests):
            parts: list[str | bytes] = [rng.choice(pool) for _ in range(self.num_images)]
            parts.append(" ".join(rng.choice(WORDS) for _ in range(self.num_text_words)))
            prompts.append([("user", parts)])
        return prompts


def start_services(
    model: str, decoder_flags: list[str] = (), encoder_flags: list[str] = ()
) -> Cluster:
    cluster = Cluster()
    encoder = cluster.start("encoder", "encoder", ["--model", model, *encoder_flags])
    decoder = cluster.start("decoder", "decoder", ["--model", model, *decoder_flags])
    cluster.start(
        "gateway", "gateway", ["--model", model, "--encoders", encoder, "--decoders", decoder]
    )
    cluster.wait_ready()
    return cluster


class Progress:
    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = total, label, 0

    def advance(self, count: int = 1) -> None:
        self.done += count
        filled = 30 * self.done // self.total
        bar = "#" * filled + "." * (30 - filled)
        print(f"\r  {self.label:<28} [{bar}] {self.done}/{self.total}", end="", flush=True)
        if self.done >= self.total:
            print()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    def cell(value: object) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
