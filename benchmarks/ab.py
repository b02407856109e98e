"""Two deployments of one checkpoint, A and B, side by side on a closed-loop cell:
how a flag, or a commit's change behind one, moves throughput, TTFT and the forward's
wait on embeddings, read from requests that ran in the same minutes of a shared host.

    python -m benchmarks.ab [--model DIR] [--cell reuse80-c4] [--requests 32]
                            [--rounds 3] [--seed 7000] [--group-size N]
                            [--decoder-flags=F] [--encoder-flags=F]
                            [--b-decoder-flags=F] [--b-encoder-flags=F] [--json OUT]

Each round draws fresh requests (seed + round: a later round never finds an earlier
one's prompts in a prefix cache) and runs `generate()`, A and B over them, taking turns
group by group in rotated order (`CellRunner.closed_loop`), every output checked against
`generate()`'s. B exists when either `--b-*` flag is given (an empty string gives an A/A
run: the noise floor); write flags as `--b-decoder-flags=--stream-interval=4`, so that
they are not read as this command's own. Each round prints every deployment's throughput
against `generate()`, its TTFT p50/p99 and its wait; the last line gives B over A round by
round, so that a slow minute falling on both cancels out:

    round 0: A 1.52x (TTFT p50 351 ms, p99 522 ms, wait 3.6%); B 1.58x (...)
    round 1: A 1.55x (TTFT p50 354 ms, p99 515 ms, wait 2.5%); B 1.62x (...)
    A 1.52-1.55x, B 1.58-1.62x; B/A 1.04, 1.05 (min 1.04, max 1.05)

The deployments are the `tessera` arm of `make bench` (the same decoder flags, the
services splitting the host's CPUs as `tessera serve` does), each with its own processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import bench_model
from benchmarks.figures import ArmFigures, CellResult
from benchmarks.inprocess import HfGenerate
from benchmarks.run import DECODER_FLAGS
from benchmarks.scale import DEFAULT_IMAGE_SIDES, FULL
from benchmarks.services import ServiceArm, add_deployment
from benchmarks.suite import Arm, CellRunner, ModelShape, References
from benchmarks.workloads import Spec
from tessera.testbed.cluster import Cluster
from tessera.testbed.devices import RunOn
from tessera.testbed.reference import Reference

CELLS = {spec.name: (spec, clients) for spec, clients in FULL.cells}


@dataclass(frozen=True)
class ArmRound:
    """One deployment in one round."""

    name: str
    vs_generate: float  # requests/s over generate()'s in the same round
    ttft_p50_ms: float
    ttft_p99_ms: float
    fetch_wait_fraction: float | None

    @classmethod
    def of(cls, figures: ArmFigures, generate: ArmFigures) -> ArmRound:
        numbers = figures.summary()
        return cls(
            figures.arm,
            figures.requests_per_s / generate.requests_per_s,
            numbers["ttft_p50_ms"],
            numbers["ttft_p99_ms"],
            figures.fetch_wait_fraction,
        )

    def describe(self) -> str:
        wait = "-" if self.fetch_wait_fraction is None else f"{100 * self.fetch_wait_fraction:.1f}%"
        return (
            f"{self.name} {self.vs_generate:.2f}x (TTFT p50 {self.ttft_p50_ms:.0f} ms, "
            f"p99 {self.ttft_p99_ms:.0f} ms, wait {wait})"
        )


def round_spec(template: Spec, num_requests: int, seed: int, round_index: int) -> Spec:
    """The template's workload with fresh requests for round `round_index`."""
    return dataclasses.replace(template, num_requests=num_requests, seed=seed + round_index)


def run_rounds(
    runner: CellRunner,
    template: Spec,
    clients: int,
    generate: Arm,
    deployments: Sequence[Arm],
    num_requests: int,
    num_rounds: int,
    seed: int,
    group_size: int | None = None,
) -> list[list[ArmRound]]:
    """Every round's figures of `deployments`, in their order, each against `generate`."""
    rounds = []
    for index in range(num_rounds):
        spec = round_spec(template, num_requests, seed, index)
        # A multi-turn cell's turn holds one request of every conversation (arms_suite).
        group = group_size or (num_requests // spec.turns if spec.turns > 1 else None)
        arms = [generate, *deployments]
        cell = runner.closed_loop(f"{spec.name} round {index}", spec, arms, clients, group)
        rounds.append(_round_figures(cell, generate.name, [d.name for d in deployments]))
        print(f"round {index}: " + "; ".join(r.describe() for r in rounds[-1]), flush=True)
    return rounds


def _round_figures(cell: CellResult, generate: str, names: list[str]) -> list[ArmRound]:
    return [ArmRound.of(cell.arms[name], cell.arms[generate]) for name in names]


def b_over_a(rounds: list[list[ArmRound]]) -> list[float]:
    """B's throughput over A's, round by round (both against the same generate())."""
    return [b.vs_generate / a.vs_generate for a, b in rounds]


def summary(rounds: list[list[ArmRound]]) -> str:
    """The run in one line: each deployment's range against generate(), and with B, B/A
    per round.

    A 1.48-1.52x, B 1.55-1.60x; B/A 1.05, 1.05 (min 1.05, max 1.05)
    """
    names = [r.name for r in rounds[0]]
    spans = []
    for column, name in enumerate(names):
        values = [round_[column].vs_generate for round_ in rounds]
        spans.append(f"{name} {min(values):.2f}-{max(values):.2f}x")
    line = ", ".join(spans)
    if len(names) == 2:
        ratios = b_over_a(rounds)
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        line += f"; B/A {listed} (min {min(ratios):.2f}, max {max(ratios):.2f})"
    return line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", help="an image family's checkpoint (default: a fresh bench LLaVA demo model)"
    )
    parser.add_argument("--cell", default="reuse80-c4", choices=sorted(CELLS))
    parser.add_argument("--requests", type=int, default=32, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7000, help="round r draws seed + r")
    parser.add_argument(
        "--group-size", type=int, help="requests per turn (default: max(clients, 4))"
    )
    for prefix, who in (("", "A's (and B's)"), ("b-", "B's own")):
        for service in ("decoder", "encoder"):
            parser.add_argument(
                f"--{prefix}{service}-flags",
                default="" if not prefix else None,
                help=f"more flags for {who} {service}",
            )
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    args = parser.parse_args(argv)
    args.with_b = args.b_decoder_flags is not None or args.b_encoder_flags is not None
    if args.requests < 1 or args.rounds < 1:
        parser.error("--requests and --rounds must be at least 1")
    return args


def deployment_flags(args: argparse.Namespace, b: bool) -> tuple[list[str], list[str]]:
    """(encoder flags, decoder flags) of A, or of B: A's plus B's own."""
    encoder = shlex.split(args.encoder_flags)
    decoder = [*DECODER_FLAGS, *shlex.split(args.decoder_flags)]
    if b:
        encoder += shlex.split(args.b_encoder_flags or "")
        decoder += shlex.split(args.b_decoder_flags or "")
    return encoder, decoder


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    model = bench_model(args.model, "llava")
    cluster = Cluster()
    deployments: list[ServiceArm] = []
    try:
        for name, b in (("A", False), ("B", True))[: 2 if args.with_b else 1]:
            encoder, decoder = deployment_flags(args, b)
            deployments.append(add_deployment(cluster, name, model, 1, encoder, decoder))
        cluster.wait_ready()
        reference = Reference(Path(model), RunOn("cpu", "float32"))
        generate = HfGenerate(reference)
        shape = ModelShape(reference.placeholder_token_id, reference.row_bytes, DEFAULT_IMAGE_SIDES)
        runner = CellRunner(References(generate), shape)
        runner.warm_up([generate, *deployments])
        template, clients = CELLS[args.cell]
        rounds = run_rounds(
            runner,
            template,
            clients,
            generate,
            deployments,
            args.requests,
            args.rounds,
            args.seed,
            args.group_size,
        )
        print(summary(rounds))
        if args.json:
            figures = [[dataclasses.asdict(arm) for arm in round_] for round_ in rounds]
            record = {"args": vars(args), "rounds": figures}
            args.json.write_text(json.dumps(record, indent=2, default=str))
    finally:
        for deployment in deployments:
            deployment.close()
        cluster.stop()


if __name__ == "__main__":
    main()
