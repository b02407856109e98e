"""`benchmarks.ab`: two deployments side by side over rounds of fresh requests, each
against generate() in the same round. Real generate() on the tiny demo checkpoint stands
in for the deployments, which only note what they were asked to run."""

from __future__ import annotations

import pytest

from benchmarks.ab import (
    ArmRound,
    b_over_a,
    deployment_flags,
    parse_args,
    round_spec,
    run_rounds,
    summary,
)
from benchmarks.inprocess import HfGenerate
from benchmarks.run import DECODER_FLAGS
from benchmarks.suite import CellRunner, ModelShape, References
from benchmarks.workloads import Spec, requests_for


class _NotingArm(HfGenerate):
    """generate() as a deployment that notes each group of requests it runs."""

    def __init__(self, reference, name: str, ran: list[tuple[str, list[str]]]):
        super().__init__(reference)
        self.name = name
        self._ran = ran

    def run(self, requests, concurrency):
        self._ran.append((self.name, [request.key for request in requests]))
        return super().run(requests, concurrency)


def _runner(reference) -> CellRunner:
    shape = ModelShape(reference.placeholder_token_id, reference.row_bytes, (32, 32))
    return CellRunner(References(HfGenerate(reference)), shape)


def _template(**changes) -> Spec:
    fields = dict(name="cell", num_requests=2, images_per_request=1, reuse=0.5, text_words=(4, 4))
    fields |= dict(output_tokens=(2, 2), seed=0, image_side=(32, 32))
    return Spec(**(fields | changes))


def test_each_round_draws_fresh_requests_and_every_deployment_runs_them(reference):
    ran: list[tuple[str, list[str]]] = []
    a, b = _NotingArm(reference, "A", ran), _NotingArm(reference, "B", ran)
    template = _template()
    runner = _runner(reference)

    rounds = run_rounds(runner, template, 2, HfGenerate(reference), [a, b], 2, 2, seed=40)

    keys = [[r.key for r in requests_for(round_spec(template, 2, 40, i))] for i in (0, 1)]
    assert set(keys[0]).isdisjoint(keys[1])  # no prefix-cache hits across rounds
    assert [(name, group) for name, group in ran] == [
        ("A", keys[0]),
        ("B", keys[0]),
        ("A", keys[1]),
        ("B", keys[1]),
    ]
    assert [[arm.name for arm in round_] for round_ in rounds] == [["A", "B"], ["A", "B"]]
    for round_ in rounds:
        for arm in round_:
            assert arm.vs_generate > 0
            assert arm.fetch_wait_fraction is None  # no decoder counters in process
    assert runner.num_checked == 12  # 2 rounds x 2 requests x (generate(), A, B)


def test_a_multi_turn_cell_takes_turns_one_conversation_turn_at_a_time(reference):
    ran: list[tuple[str, list[str]]] = []
    template = _template(name="multiturn", turns=2, reuse=0.0)
    generate = _NotingArm(reference, "hf-generate", ran)

    run_rounds(_runner(reference), template, 2, generate, [], 4, 1, seed=3)

    keys = [r.key for r in requests_for(round_spec(template, 4, 3, 0))]
    assert [group for _, group in ran] == [keys[:2], keys[2:]]  # turn 1, then turn 2


def _round(a: float, b: float) -> list[ArmRound]:
    return [ArmRound("A", a, 100.0, 200.0, 0.02), ArmRound("B", b, 90.0, 180.0, None)]


def test_b_over_a_is_read_round_by_round():
    rounds = [_round(1.50, 1.65), _round(1.20, 1.20)]
    assert b_over_a(rounds) == pytest.approx([1.10, 1.0])
    assert summary(rounds) == "A 1.20-1.50x, B 1.20-1.65x; B/A 1.10, 1.00 (min 1.00, max 1.10)"
    assert summary([[r[0]] for r in rounds]) == "A 1.20-1.50x"
    assert _round(1.5, 1.5)[0].describe() == "A 1.50x (TTFT p50 100 ms, p99 200 ms, wait 2.0%)"
    assert _round(1.5, 1.5)[1].describe() == "B 1.50x (TTFT p50 90 ms, p99 180 ms, wait -)"


def test_b_runs_as_a_does_plus_its_own_flags_and_only_when_asked_for():
    args = parse_args(["--decoder-flags", "--stream-interval 4", "--encoder-flags", "--x 1"])
    assert not args.with_b
    assert deployment_flags(args, b=False) == (
        ["--x", "1"],
        [*DECODER_FLAGS, "--stream-interval", "4"],
    )
    args = parse_args(["--decoder-flags", "--stream-interval 4", "--b-decoder-flags=--y"])
    assert args.with_b
    assert deployment_flags(args, b=True)[1] == [*DECODER_FLAGS, "--stream-interval", "4", "--y"]
    assert parse_args(["--b-encoder-flags", ""]).with_b  # an A/A run: the noise floor
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
