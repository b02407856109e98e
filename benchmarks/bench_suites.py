"""The suites of `make bench` (`benchmarks.run.Bench` inherits them): each runs its
workloads on the deployments `Bench.start` made, records its figures in `self.results`
and its tables in `self.md`. `benchmarks.options.run_suites` calls them by name
(`<suite>_suite`); those that start processes of their own (`step`, `video`) run after
`Bench.stop`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import ceiling, disagg, fleet, growth, latency, must_show, plots, report, wire
from benchmarks.workloads import Spec

# Families that take video: the video suite runs on the run's model when it is one.
VIDEO_FAMILIES = ("qwen2-vl", "qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe")


class Suites:
    """The suite methods; the attributes they use (`args`, `scale`, `runner`, `arms`,
    the deployments, `results`, `md`) are set by `Bench`."""

    def arms_suite(self) -> None:
        cells = [
            self.runner.closed_loop(
                spec.name,
                spec,
                self.arms,
                concurrency,
                spec.num_requests // spec.turns if spec.turns > 1 else None,
            )
            for spec, concurrency in self.scale.cells
        ]
        self.cells = cells
        self.results["cells"] = [c.summary() for c in cells]
        self.md += [
            "## Arms side by side\n",
            "### Headline: tessera against each arm\n",
            report.headline_table(cells),
            "",
        ]
        self.md += ["### Every arm, workload by workload\n", *map(report.cell_section, cells)]
        by_name = {c.name: c for c in cells}
        sweep = [by_name[n] for n in ("reuse80-c1", "reuse80-c4", "reuse80-c16") if n in by_name]
        out = self.args.out
        plots.throughput_vs_concurrency(sweep, out / "throughput_vs_concurrency.png")
        plots.latency_cdfs(by_name["reuse80-c4"], out / "latency_cdfs.png")
        self.md += [
            "![throughput](throughput_vs_concurrency.png)",
            "![latency CDFs](latency_cdfs.png)",
            "",
        ]

    def chunks_suite(self) -> None:
        cells = []
        for index, chunk in enumerate(self.scale.chunk_sizes):
            spec = Spec(
                f"chunk-{chunk}",
                self.scale.chunk_requests,
                self.scale.chunk_images,
                0.0,
                output_tokens=(16, 16),
                chunk_tokens=chunk,
                seed=200 + index,
            )
            cells.append(self.runner.closed_loop(spec.name, spec, self.arms, 2))
        self.chunk_cells = cells
        self.results["chunks"] = [c.summary() for c in cells]
        plots.bytes_vs_chunk(cells, self.args.out / "bytes_vs_chunk.png")
        self.md += [
            "## Chunk size: bytes received and encoder passes\n",
            f"{cells[0].description.split(', chunk')[0]}, fresh images per chunk size, "
            "2 clients.\n",
            report.chunk_table(cells),
            "",
            "![bytes vs chunk](bytes_vs_chunk.png)",
            "",
        ]

    def poisson_suite(self) -> None:
        spec = Spec(
            "poisson", self.scale.poisson_requests, 1, 0.8, output_tokens=(16, 64), seed=300
        )
        cell = self.runner.open_loop(
            "open-loop Poisson",
            spec,
            [self.whole, self.no_cache, self.tessera],
            self.scale.poisson_rate,
            segment=8,
        )
        self.results["poisson"] = cell.summary()
        self.md += ["## Open loop (Poisson arrivals)\n", report.cell_section(cell)]

    def latency_suite(self) -> None:
        long_prompts = Spec(
            "long",
            self.scale.latency_long_prompts,
            4,
            0.0,
            text_words=(200, 200),
            output_tokens=(4, 4),
            seed=400,
        )
        long_prompts = self.runner.with_default_side(long_prompts)
        self.latency = [
            latency.measure(self.tessera, chunk, long_prompts)
            for chunk in self.scale.latency_chunks
        ]
        self.results["latency"] = [vars(r) | {"p99_over_p50": r.p99_over_p50} for r in self.latency]
        self.md += [
            "## Inter-token latency while a long multimodal prompt prefills (tessera)\n",
            "3 streams decode while prompts of 4 images + 200 words arrive.\n",
            latency.table(self.latency),
            "",
        ]

    def wire_suite(self) -> None:
        address = self.cluster.address(self.tessera.encoders[0])
        self.wire = wire.measure(
            address, self.model, self.fingerprint, self.scale.wire_copies, self.scale.wire_repeats
        )
        self.results["wire"] = {"bytes": self.wire.num_bytes, "mib_per_s": self.wire.mib_per_s}
        self.md += [
            "## Wire: embedding slices over gRPC vs raw loopback TCP\n",
            f"{self.wire.num_bytes / 2**20:.0f} MiB per run.\n",
            wire.table(self.wire),
            "",
        ]

    def step_suite(self) -> None:
        out = self.args.out / "step.json"
        quick = ["--repeats", "1", "--batch-sizes", "1", "4"] if self.args.quick else []
        command = [sys.executable, "-m", "benchmarks.step", "--model", self.model]
        subprocess.run([*command, "--json", str(out), *quick], check=True)
        self.step = json.loads(out.read_text())
        self.results["step"] = self.step
        self.md += [
            "## Decode step by batch size (the decoder's engine, in a process of its own)\n",
            f"Prompts of {self.step['prompt_tokens']} tokens; generate(): "
            f"{self.step['generate_ms']:.2f} ms per token; the engine's linears: "
            f"{self.step['linear_kernel']}.\n",
            self.step["table"],
            "",
        ]

    def ceiling_suite(self) -> None:
        """The host's bounds (benchmarks.ceiling), which the must-show figures are read
        against: the parts' costs measured alone the same hour as the run."""
        out = self.args.out / "ceiling.json"
        burst = ceiling.first_burst(self.scale.cells, tuple(self.env["image_sides"]))
        command = [sys.executable, "-m", "benchmarks.ceiling", "--model", self.model]
        command += ["--burst", str(burst.num_prompts), str(burst.num_new_images)]
        quick = ["--repeats", "1"] if self.args.quick else []
        subprocess.run([*command, "--json", str(out), *quick], check=True)
        figures = json.loads(out.read_text())
        self.results["ceiling"] = figures
        ratios = {name: must_show.throughput(name)(self.results) for name, *_ in ceiling.CELLS}
        measured = {name: ratio for name, ratio in ratios.items() if ratio is not None}
        self.md += [
            "## The host's bounds (the parts alone, in a process of their own)\n",
            figures["summary"] + ".\n",
            ceiling.table(figures["ceilings"], measured),
            "",
        ]

    def video_suite(self) -> None:
        out = self.args.out / "video.json"
        command = [sys.executable, "-m", "benchmarks.video", "--json", str(out)]
        if self.args.family in VIDEO_FAMILIES:  # else it makes its own Qwen2.5-VL model
            command += ["--model", self.model]
        if self.args.quick:
            command += ["--requests", "6", "--seconds", "10", "30"]
        subprocess.run(command, check=True)
        self.video = json.loads(out.read_text())
        self.results["video"] = self.video["cell"]
        self.md += [
            "## Video: rows per chunk vs the whole video per chunk (in a process of its own)\n",
            self.video["table"],
            "",
            self.video["section"],
        ]

    def growth_suite(self) -> None:
        arms = [self.hf, self.tessera, *self.extra_arms]
        repeats = self.scale.growth_repeats
        results = growth.measure(self.runner, arms, repeats, self.scale.growth_values)
        self.results["growth"] = [
            {"axis": s.axis, "value": s.value, **c.summary()} for s, c in results
        ]
        sides = growth.large_image(self.runner, arms, repeats)
        self.results["large_image"] = sides
        small, large = growth.LARGE_IMAGE_SIDES
        self.md += [
            "## Cost growth (one request at a time, fresh images)\n",
            growth.table(
                results, self.hf.name, self.tessera.name, [a.name for a in self.extra_arms]
            ),
            "",
            f"TTFT p50 of a {large} px image over a {small} px one, the two sides' requests "
            f"alternating ({repeats} a side): {growth.large_image_text(sides)}.",
            "",
        ]

    def fleet_suite(self) -> None:
        s = self.scale
        self.fleet_results = fleet.run_workloads(
            self.runner,
            self.fleet,
            self.no_cache,
            s.fleet_requests,
            s.fleet_pool,
            s.fleet_verify_every,
        )
        from tessera.hashing import model_fingerprint

        batching = fleet.batching(
            {n: self.cluster.address(n) for n in ("batch-on", "batch-off")},
            model_fingerprint(Path(self.model)),
            s.batching_items,
        )
        self.results["fleet"] = fleet.summary(self.fleet_results, batching)
        self.md += [
            "## Encoder fleet (issue 4)\n",
            fleet.fleet_table(self.fleet_results, "fleet", "no-cache"),
            "",
            fleet.batching_table(batching),
            "",
        ]

    def disagg_suite(self) -> None:
        results = disagg.measure(
            self.runner, self.colocated, self.tessera, self.scale.disagg_requests
        )
        self.results["disagg"] = [c.summary() for c in results]
        self.md += [
            "## When disaggregation pays off: colocated vs tessera\n",
            disagg.table(results, self.colocated.name, self.tessera.name),
            "",
            *map(report.cell_section, results),
        ]
