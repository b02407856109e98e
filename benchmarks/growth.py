"""How time and memory grow with images per request, image size and prompt length:
generate() and Tessera, one request at a time, interleaved request by request, every
request with fresh images (so each one is encoded)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.common import markdown_table
from benchmarks.figures import CellResult, median
from benchmarks.inprocess import HfGenerate
from benchmarks.must_show import side_overheads
from benchmarks.services import ServiceArm
from benchmarks.suite import CellRunner
from benchmarks.workloads import Spec


@dataclass(frozen=True)
class Setting:
    axis: str
    value: str
    spec: Spec


# The engine-speed issue's large-image figure: a 1536 px image's TTFT over a 512 px one's.
LARGE_IMAGE_SIDES = (512, 1536)


def _spec(name: str, repeats: int, images: int, words: int, side: int, seed: int) -> Spec:
    """`repeats` requests of `images` fresh images of `side` px and `words` words."""
    return Spec(
        name,
        repeats,
        images,
        reuse=0.0,
        text_words=(words, words),
        output_tokens=(16, 16),
        chunk_tokens=256,
        seed=seed,
        image_side=(side, side),
    )


def settings(repeats: int, values: dict[str, tuple[int, ...]], seed: int = 9000) -> list[Setting]:
    def spec(name: str, images: int, words: int, side: int) -> Spec:
        nonlocal seed
        seed += 1
        return _spec(name, repeats, images, words, side, seed)

    return [
        *(
            Setting("images / request", str(n), spec(f"images-{n}", n, 32, 224))
            for n in values["images"]
        ),
        *(
            Setting("image side (px)", str(side), spec(f"side-{side}", 1, 32, side))
            for side in values["side"]
        ),
        *(
            Setting("text words", str(words), spec(f"words-{words}", 1, words, 224))
            for words in values["words"]
        ),
    ]


def measure(
    runner: CellRunner,
    arms: Sequence[HfGenerate | ServiceArm],
    repeats: int,
    values: dict[str, tuple[int, ...]],
) -> list[tuple[Setting, CellResult]]:
    """Every setting's requests through `arms` (generate() first), taking turns request
    by request, so that load on the machine falls on every arm alike."""
    results = []
    for setting in settings(repeats, values):
        cell = runner.closed_loop(
            f"growth {setting.spec.name}", setting.spec, list(arms), 1, group_size=1
        )
        results.append((setting, cell))
    return results


def large_image(
    runner: CellRunner, arms: Sequence[HfGenerate | ServiceArm], repeats: int, seed: int = 9500
) -> list[dict]:
    """`repeats` requests a side of one fresh 512 px or 1536 px image, the two sides
    alternating request by request (CellRunner.alternating): the growth table runs each
    side in a window of its own, and on a shared host a slow window read generate()'s
    512 px TTFT above its 1536 px one (cea1d58's run). One row per side, as the growth
    rows: {"value": "512", "arms": {arm: figures}, ...}."""
    specs = [
        _spec(f"alternating-{side}", repeats, 1, 32, side, seed + index)
        for index, side in enumerate(LARGE_IMAGE_SIDES)
    ]
    cells = runner.alternating(specs, list(arms))
    return [
        {"value": str(side), **cell.summary()}
        for side, cell in zip(LARGE_IMAGE_SIDES, cells, strict=True)
    ]


def large_image_text(rows: list[dict]) -> str:
    """One line: each arm's TTFT p50 at the larger side minus at the smaller.

    Example: "generate() +51 ms; tessera +156 ms; tessera-mtls +106 ms"."""
    overheads = side_overheads(rows)
    names = {"hf-generate": "generate()"}
    return "; ".join(f"{names.get(arm, arm)} {ms:+.0f} ms" for arm, ms in overheads.items())


def table(
    results: list[tuple[Setting, CellResult]],
    hf_name: str,
    tessera_name: str,
    others: Sequence[str] = (),
) -> str:
    """One row per setting; `others` (more service arms) add a TTFT column each."""
    rows = []
    for setting, cell in results:
        hf, tessera = cell.arms[hf_name], cell.arms[tessera_name]
        memory = tessera.peak_rss_mb
        rows.append(
            [
                setting.axis,
                setting.value,
                round(cell.mean_prompt_tokens),
                median(hf.latency_s) * 1000,
                median(tessera.latency_s) * 1000,
                median(hf.ttft_s) * 1000,
                median(tessera.ttft_s) * 1000,
                *(median(cell.arms[name].ttft_s) * 1000 for name in others),
                hf.peak_rss_mb.get("process"),
                memory.get("gateway"),
                memory.get("encoder"),
                memory.get("decoder"),
            ]
        )
    return markdown_table(
        [
            "axis",
            "value",
            "prompt tokens",
            "generate() ms",
            "tessera ms",
            "generate() TTFT ms",
            "tessera TTFT ms",
            *(f"{name} TTFT ms" for name in others),
            "generate() peak RSS MB",
            "gateway MB",
            "encoder MB",
            "decoder MB",
        ],
        rows,
    )
