"""The cost of one decode step, by batch size, against `generate()`'s per-token cost.

Both sides run in this process on the same checkpoint and the same text prompts (no
media: this measures the language model's step, not the fetches):
- `tessera`: the decoder's own engine (`build_engine`, paged attention, the scheduler and
  batched sampler), `n` requests queued together. A request's decode cost is the
  engine's forward time for `max_tokens = 1 + k` minus that for `max_tokens = 1`
  (prefill only), divided by `k`: the prefill cancels out.
- `generate()`: one request at a time, the same subtraction on its wall time.
Both take the best of `--repeats` runs.
Everything runs on the process's compute thread, as in the services.

Usage: python -m benchmarks.step [--model DIR] [--batch-sizes 1 2 4 8] [--prompt-tokens N]
                                 [--json OUT]
`make bench` runs it in a process of its own (suite `step`), so that its torch thread
does not share a process with the in-process arms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.common import bench_model, markdown_table
from decoder_service.config import DecoderConfig
from decoder_service.main import build_engine, encoder_replicas, load_options
from decoder_service.main import build_parser as build_decoder_parser
from decoder_service.request import DecodeSpec, SamplingOptions
from tessera.adapters import load_family
from tessera.compute_thread import compute_thread

NUM_DECODE_TOKENS = 32


@dataclass(frozen=True)
class StepCost:
    batch_size: int
    step_ms: float  # one engine step decoding `batch_size` requests
    per_request_ms: float


def prompts(num_requests: int, num_tokens: int, vocab: int) -> list[tuple[int, ...]]:
    generator = torch.Generator().manual_seed(num_tokens)
    return [
        tuple(torch.randint(10, vocab - 10, (num_tokens,), generator=generator).tolist())
        for _ in range(num_requests)
    ]


def decoder_config(model: str, flags: Sequence[str] = ()) -> DecoderConfig:
    """The decoder's defaults and `flags`, with room for every prompt of the largest batch."""
    room = ["--max-num-seqs", "64", "--max-num-batched-tokens", "8192"]
    args = build_decoder_parser().parse_args(["--model", model, *room, *flags])
    return DecoderConfig.from_args(args)


def load_language_model(model: str):
    """The family as the decoder loads it (its linear kernel included), on the compute
    thread: every torch op on one thread, as the services run them."""
    return compute_thread().call(load_family, model, load_options(decoder_config(model)))


def engine_forward_seconds(
    family, model: str, token_ids: list[tuple[int, ...]], k: int, flags: Sequence[str] = ()
) -> float:
    """Forward time of one engine (the decoder's `flags`) serving every prompt together,
    `1 + k` tokens each."""
    config = decoder_config(model, flags)
    engine = build_engine(config, family, encoder_replicas(config))

    async def run() -> None:
        async def one(index: int, prompt: tuple[int, ...]) -> None:
            sampling = SamplingOptions(max_tokens=1 + k, ignore_eos=True)
            spec = DecodeSpec(f"step-{index}", prompt, (), sampling, max_chunk_tokens=4096)
            async for _ in engine.generate(spec):
                pass

        tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(token_ids)]
        while len(engine.scheduler.waiting) < len(token_ids):
            await asyncio.sleep(0)
        engine.start()
        await asyncio.gather(*tasks)

    asyncio.run(run())
    return engine.counters.forward_seconds


@dataclass(frozen=True)
class TokenCosts:
    prefill_seconds: float  # a run that makes one token: the prefill
    token_seconds: float  # each further token


def token_costs(seconds: Callable[[int], float], repeats: int) -> TokenCosts:
    """From `seconds(n)`, a timed run making `n` tokens: the best of `repeats` runs of one
    token, and the best of `repeats` runs of `1 + NUM_DECODE_TOKENS` less it, per token
    (the runs alternate). The best of each, the least disturbed by other work, rather
    than the best difference: a pair whose short run was slowed and whose long run was
    not reads a token cheaper than any run made it (one full run's step of 16 read 9.24
    ms that way, below its step of 4).

    Example: one token 40, 41, 44 ms; 33 tokens 200, 196, 230 ms -> prefill 40 ms,
    (196 - 40) / 32 = 4.875 ms a token (the best difference would read 4.84).
    """
    prefills, totals = [], []
    for _ in range(repeats):
        prefills.append(seconds(1))
        totals.append(seconds(1 + NUM_DECODE_TOKENS))
    prefill = min(prefills)
    return TokenCosts(prefill, (min(totals) - prefill) / NUM_DECODE_TOKENS)


def tessera_step(family, model: str, batch_size: int, prompt_tokens: int, repeats: int) -> float:
    token_ids = prompts(batch_size, prompt_tokens, family.vocab_size)

    def seconds(num_tokens: int) -> float:
        return engine_forward_seconds(family, model, token_ids, num_tokens - 1)

    return token_costs(seconds, repeats).token_seconds


def generate_timer(model: str, prompt_tokens: int) -> Callable[[int], float]:
    """A function timing generate() of `n` new tokens on a text prompt of
    `prompt_tokens`, in seconds (greedy, exactly `n` tokens)."""
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float32).eval()
    (prompt,) = prompts(1, prompt_tokens, hf.config.get_text_config().vocab_size)
    input_ids = torch.tensor([prompt])

    def seconds(new_tokens: int) -> float:
        started = time.perf_counter()
        with torch.inference_mode():
            hf.generate(
                input_ids=input_ids,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
            )
        return time.perf_counter() - started

    seconds(2)  # warm-up
    return seconds


def generate_token_seconds(model: str, prompt_tokens: int, repeats: int) -> float:
    return token_costs(generate_timer(model, prompt_tokens), repeats).token_seconds


def measure(model: str, batch_sizes: list[int], prompt_tokens: int, repeats: int) -> dict:
    family = load_language_model(model)
    tessera_step(family, model, 1, prompt_tokens, 1)  # warm-up
    costs = []
    for batch_size in batch_sizes:
        step = tessera_step(family, model, batch_size, prompt_tokens, repeats)
        costs.append(StepCost(batch_size, step * 1000, step * 1000 / batch_size))
        print(f"batch {batch_size}: decode step {step * 1000:.2f} ms", flush=True)
    reference = compute_thread().call(generate_token_seconds, model, prompt_tokens, repeats)
    reference *= 1000
    print(f"generate(): {reference:.2f} ms per token", flush=True)
    return {
        "prompt_tokens": prompt_tokens,
        "generate_ms": reference,
        "linear_kernel": family.linear_kernel,
        "costs": costs,
    }


def table(result: dict) -> str:
    single = result["costs"][0].step_ms
    rows = [
        [
            str(cost.batch_size),
            f"{cost.step_ms:.2f}",
            f"{cost.step_ms / single:.2f}x",
            f"{cost.per_request_ms:.2f}",
            f"{cost.step_ms / result['generate_ms']:.2f}x",
        ]
        for cost in result["costs"]
    ]
    header = [
        "decoding requests",
        "step ms",
        "step / step of 1",
        "ms per request",
        "step / generate() token",
    ]
    return markdown_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = compute_thread().call(bench_model, args.model, "llava")  # builds with torch
    result = measure(model, args.batch_sizes, args.prompt_tokens, args.repeats)
    print(f"generate(): {result['generate_ms']:.2f} ms per token, prompt {args.prompt_tokens}")
    print(table(result))
    if args.json:
        costs = [vars(cost) for cost in result["costs"]]
        args.json.write_text(json.dumps({**result, "costs": costs, "table": table(result)}))


if __name__ == "__main__":
    main()
