"""An exception in the engine's loop (a bug) fails the requests it held, is counted, and
never ends the loop: an ended loop hangs every request, running or yet to come."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from decoder_service.request import DecodeSpec, SamplingOptions
from decoder_service.servicer import engine_stats_to_proto
from tessera.testbed.reference import noise_image, to_chat_inputs
from tests.service.test_engine import (
    TEXT_PROMPTS,
    decode_spec,
    decoder_family,
    in_process_engine,
    run_all,
)

SAMPLING = SamplingOptions(max_tokens=4, ignore_eos=True)


def text_specs(builder, prefix: str, num_prompts: int) -> list[DecodeSpec]:
    prompts = [builder.build(to_chat_inputs(p)).token_ids for p in TEXT_PROMPTS[:num_prompts]]
    return [
        DecodeSpec(f"{prefix}-{i}", tuple(p), (), SAMPLING, max_chunk_tokens=64)
        for i, p in enumerate(prompts)
    ]


def fail_first_calls(function, num_failures: int):
    """`function`, raising a RuntimeError on its first `num_failures` calls."""
    calls = 0

    def faulty(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls <= num_failures:
            raise RuntimeError(f"injected fault {calls}")
        return function(*args, **kwargs)

    return faulty


def test_an_error_while_the_engine_idles_does_not_end_its_loop(demo_model_dir, caplog):
    """The idle branch raises three times in a row (a bug injected where the engine tells
    the encoders it no longer idles); the loop logs and counts each and still serves the
    next request as an engine without the fault. Before, the first error ended the loop
    and this request waited for ever."""
    family, builder = decoder_family(demo_model_dir)
    flags = ["--model", str(demo_model_dir)]
    engine = in_process_engine(family, flags)
    expediter = engine.prefetcher.expediter
    expediter.not_idle = fail_first_calls(expediter.not_idle, 3)
    (later,) = text_specs(builder, "later", 1)

    async def scenario() -> list[int]:
        engine.start()  # nothing to do: the loop idles, and its idle branch raises
        while engine.counters.num_engine_errors < 3:
            await asyncio.sleep(0.001)
        return (await run_all(engine, [later], start=False))[0]

    served = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert engine.counters.num_engine_errors == 3
    assert engine_stats_to_proto(engine).num_engine_errors == 3  # GetStats and /metrics
    assert caplog.text.count("RuntimeError: injected fault") == 3  # each with its traceback
    clean = in_process_engine(family, flags)
    assert served == asyncio.run(run_all(clean, [replace(later, request_id="clean")]))[0]


def test_an_error_in_a_step_fails_the_requests_it_held_and_is_counted(demo_model_dir):
    """The scheduler raises once, with two requests queued: both fail with an internal
    error, and a later request is served as an engine without the fault serves it."""
    family, builder = decoder_family(demo_model_dir)
    flags = ["--model", str(demo_model_dir)]
    engine = in_process_engine(family, flags)
    engine.scheduler.schedule = fail_first_calls(engine.scheduler.schedule, 1)
    held = text_specs(builder, "held", 2)
    (later,) = text_specs(builder, "later", 1)

    async def scenario() -> tuple[list, list[int]]:
        failed = await run_all(engine, held, return_exceptions=True)
        return failed, (await run_all(engine, [later], start=False))[0]

    failed, served = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert [str(error) for error in failed] == ["internal error in the decoder engine"] * 2
    assert engine.counters.num_engine_errors == 1
    kv = engine.scheduler.kv
    assert not engine.scheduler.has_work() and kv.stats().num_free_blocks == kv.num_blocks
    clean = in_process_engine(family, flags)
    assert served == asyncio.run(run_all(clean, [replace(later, request_id="clean")]))[0]


def test_an_error_in_telling_the_encoders_fails_no_request(demo_model_dir, caplog):
    """Expedite is advisory: its bookkeeping raising (a bug injected where it looks up an
    item's encoder) is logged, and the idle and no-longer-idle calls return normally, so
    the engine's step does not fail the requests it holds for a hint."""
    family, builder = decoder_family(demo_model_dir)
    engine = in_process_engine(
        family, ["--model", str(demo_model_dir), "--encoders", "127.0.0.1:1"]
    )
    prompt = [("user", ["Look:", noise_image(7304, 40, 40), "What is in it?"])]
    (item,) = decode_spec(family, builder, "127.0.0.1:1", 0, prompt, 16).items

    def failing(item) -> str:
        raise RuntimeError("injected fault in computing_at")

    engine.embeddings.computing_at = failing
    expediter = engine.prefetcher.expediter

    async def scenario() -> None:
        expediter.idle_for([item])
        expediter.now_computing("127.0.0.1:1", item.range.content_hash)
        expediter.not_idle()

    asyncio.run(scenario())
    assert caplog.text.count("RuntimeError: injected fault in computing_at") == 2
    assert expediter.num_calls == 0
