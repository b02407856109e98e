"""Expedite on the encoder: while a decoder idles for an item of the batch computing,
the batch runs on the wide threads, switched before each of the tower's modules, so a
call (idle, or no longer) during the forward counts from the next module on; a call
overtaken by a later one is ignored; an item a decoder idles for does not wait for its
batch to fill. The model is a stand-in whose forward is held by events and that records
the compute thread's torch threads, so no outcome depends on timing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
import torch

from encoder_service.encoder import EncoderCore
from encoder_service.expedite import IdleDecoders, TowerThreads
from encoder_service.items import EncodeItem
from encoder_service.memory_store import MemoryStore
from tessera.adapters import MediaInput
from tessera.compute_thread import compute_thread
from tessera.media import ProcessingOptions, decode_image
from tessera.media_decoder import MediaLimits
from tessera.placeholders import Modality
from tessera.testbed.reference import noise_image

FINGERPRINT = "e" * 32
NARROW, WIDE = 1, 2


class TwoStepFamily:
    """Encodes each batch in two modules, between which it sets `midway` and waits for
    `release` (each batch for its own, unless `run_freely`). Records the torch threads
    each module ran on, per batch."""

    modalities = frozenset({Modality.IMAGE})
    fingerprint = FINGERPRINT
    processed_pixels_shape = None

    def __init__(self) -> None:
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.midway, self.release = threading.Event(), threading.Event()
        self.keep_released = False
        self.threads: list[tuple[int, int]] = []  # (first module, second module) per batch
        self._seen: list[int] = []
        for module in (self.first, self.second):
            module.register_forward_hook(self._record)

    def _record(self, module, args, output) -> None:
        self._seen.append(torch.get_num_threads())

    def check_options(self, options: ProcessingOptions) -> None:
        pass

    def media_encoder_modules(self) -> list[torch.nn.Module]:
        return [self.first, self.second]

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        self._seen = []
        hidden = self.first(torch.ones(len(items), 4))
        self.midway.set()
        assert self.release.wait(30)
        if not self.keep_released:
            self.release.clear()
        rows = self.second(hidden)
        self.threads.append((self._seen[0], self._seen[1]))
        return [row.detach().reshape(1, 4) for row in rows]

    async def at_midway(self) -> None:
        """Until a batch is between its two modules (and held there)."""
        await asyncio.to_thread(self.midway.wait, 30)
        self.midway.clear()

    def run_freely(self) -> None:
        self.keep_released = True
        self.release.set()


def image_item(seed: int) -> EncodeItem:
    data = noise_image(seed, 20, 20)
    return EncodeItem(decode_image(data).content_hash(FINGERPRINT), Modality.IMAGE, data)


@pytest.fixture
def compute_threads():
    """The compute thread's torch threads are put back after the test."""
    before = compute_thread().call(torch.get_num_threads)
    compute_thread().call(torch.set_num_threads, NARROW)
    yield
    compute_thread().call(torch.set_num_threads, before)


def encoder_core(family: TwoStepFamily, max_batch_items: int = 1, wait_ms: float = 0.0):
    threads = TowerThreads(NARROW, WIDE)
    threads.attach(family.media_encoder_modules())
    return EncoderCore(
        family,
        MemoryStore(1 << 20),
        max_batch_items,
        wait_ms,
        MediaLimits(10**6),
        threads=threads,
    )


def test_each_decoder_is_heard_in_order_and_items_done_are_forgotten():
    decoders = IdleDecoders(max_decoders=2)
    assert decoders.say("d1", 1, frozenset({"a", "b"}))
    assert decoders.say("d2", 7, frozenset({"c"}))
    assert decoders.wanted(["b"]) and decoders.wanted(["c", "x"]) and not decoders.wanted(["x"])
    assert not decoders.say("d1", 1, frozenset())  # overtaken by a later call: ignored
    assert decoders.wanted(["a"])
    assert decoders.say("d1", 2, frozenset())  # no longer idle
    assert not decoders.wanted(["a", "b"]) and len(decoders) == 1
    decoders.forget_done(in_flight={"x"})  # c was computed, found elsewhere or cancelled
    assert not decoders.wanted(["c"]) and len(decoders) == 0
    assert decoders.say("d3", 1, frozenset({"e"}))  # d2, the longest silent, is forgotten
    assert decoders.say("d2", 1, frozenset({"f"}))  # ... so its sequence starts anew
    assert decoders.wanted(["e"]) and decoders.wanted(["f"])


def test_items_run_wide_while_their_decoder_idles_and_narrow_once_it_has_work(
    compute_threads,
):
    """A starts narrow; a decoder says it idles for A and B: A's second module and B's
    first run wide; the decoder says it has work: B's second module runs narrow. A call
    overtaken by that one, arriving after it, changes nothing."""
    family = TwoStepFamily()

    async def scenario() -> None:
        core = encoder_core(family)
        first, second = image_item(1), image_item(2)
        pending = [core.begin_encode([item], None) for item in (first, second)]
        idle_for_both = [first.content_hash, second.content_hash, "ab" * 32]
        await family.at_midway()
        assert core.expedite("d", 1, idle_for_both) == 2  # the unknown hash is ignored
        family.release.set()
        await family.at_midway()
        assert core.expedite("d", 2, []) == 0
        assert core.expedite("d", 1, idle_for_both) == 1  # overtaken: ignored
        family.release.set()
        await asyncio.gather(*pending)
        assert core.counters.num_expedite_calls == 1
        assert core.counters.num_expedited_batches == 2

    asyncio.run(scenario())
    assert family.threads == [(NARROW, WIDE), (WIDE, NARROW)]
    assert compute_thread().call(torch.get_num_threads) == NARROW  # after the batches


def test_items_not_in_flight_change_nothing(compute_threads):
    family = TwoStepFamily()
    family.run_freely()

    async def scenario() -> None:
        core = encoder_core(family)
        assert core.expedite("d", 1, ["ab" * 32]) == 0
        await core.encode([image_item(4)], None)
        assert core.counters.num_expedite_calls == 0
        assert core.counters.num_expedited_batches == 0
        assert len(core.expediter.decoders) == 0

    asyncio.run(scenario())
    assert family.threads == [(NARROW, NARROW)]


def test_an_item_a_decoder_idles_for_does_not_wait_for_its_batch_to_fill(compute_threads):
    """Batches of two that wait ten minutes to fill: one item alone runs only because a
    decoder idles for it (without the call the test would time out)."""
    family = TwoStepFamily()
    family.run_freely()

    async def scenario() -> None:
        core = encoder_core(family, max_batch_items=2, wait_ms=600_000)
        item = image_item(5)
        pending = core.begin_encode([item], None)
        while core.batcher.queue_depth == 0:  # queued, and the batch waits to fill
            await asyncio.sleep(0)
        assert core.expedite("d", 1, [item.content_hash]) == 1
        (result,) = await asyncio.wait_for(pending, 60)
        assert result.block.num_rows == 1
        assert core.counters.num_expedited_batches == 1

    asyncio.run(scenario())
    assert family.threads == [(WIDE, WIDE)]


def test_threads_no_wider_than_the_narrow_ones_are_never_set():
    calls: list[int] = []
    threads = TowerThreads(2, 1, set_threads=calls.append)
    module = torch.nn.Linear(2, 2)
    threads.attach([module])
    threads.expedited = True
    threads.run(module, torch.ones(1, 2))
    assert not threads.can_widen and calls == []
    unchanged = TowerThreads.unchanged()
    unchanged.expedited = True
    unchanged.run(lambda: [])
    assert not unchanged.can_widen
