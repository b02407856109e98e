"""`CellRunner.alternating`: the specs' requests take turns one by one, arms rotated, so
that a difference between two specs is read from requests that ran side by side. Real
generate() on the tiny demo checkpoint; the arms only note what they were asked to run."""

from __future__ import annotations

from benchmarks.growth import large_image_text
from benchmarks.inprocess import HfGenerate
from benchmarks.suite import CellRunner, ModelShape, References
from benchmarks.workloads import Spec, requests_for

_SIDES = (32, 48)


class _NotingArm(HfGenerate):
    """generate() as an arm that also notes each request it runs, in order."""

    def __init__(self, reference, name: str, ran: list[tuple[str, str]]):
        super().__init__(reference)
        self.name = name
        self._ran = ran

    def run(self, requests, concurrency):
        self._ran += [(self.name, request.key) for request in requests]
        return super().run(requests, concurrency)


def _spec(name: str, side: int, seed: int) -> Spec:
    return Spec(
        name, 2, 1, 0.0, text_words=(4, 4), output_tokens=(2, 2), seed=seed, image_side=(side, side)
    )


def test_the_specs_take_turns_request_by_request_and_the_arms_rotate(reference):
    ran: list[tuple[str, str]] = []
    shape = ModelShape(reference.placeholder_token_id, reference.row_bytes, (32, 32))
    runner = CellRunner(References(HfGenerate(reference)), shape)
    arms = [_NotingArm(reference, "first", ran), _NotingArm(reference, "second", ran)]
    small, large = _spec("small", _SIDES[0], 1), _spec("large", _SIDES[1], 2)
    keys = {spec.name: [r.key for r in requests_for(spec)] for spec in (small, large)}

    cells = runner.alternating([small, large], arms)

    assert ran == [
        ("first", keys["small"][0]),
        ("second", keys["small"][0]),
        ("first", keys["large"][0]),
        ("second", keys["large"][0]),
        ("second", keys["small"][1]),
        ("first", keys["small"][1]),
        ("second", keys["large"][1]),
        ("first", keys["large"][1]),
    ]
    assert [cell.name for cell in cells] == ["small", "large"]
    for cell in cells:
        for figures in cell.arms.values():
            assert len(figures.ttft_s) == 2
            assert figures.forward_seconds is None  # services' counters: left unset
    assert runner.num_checked == 8  # every output against generate()'s own


def test_the_large_image_line_reads_each_arms_difference():
    def row(side: str, generate_ms: float, tessera_ms: float) -> dict:
        arms = {"hf-generate": {"ttft_p50_ms": generate_ms}, "t": {"ttft_p50_ms": tessera_ms}}
        return {"value": side, "arms": arms}

    rows = [row("512", 100.0, 90.0), row("1536", 93.0, 150.0)]
    assert large_image_text(rows) == "generate() -7 ms; t +60 ms"
