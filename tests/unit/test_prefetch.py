"""The prefetcher's view of which items an encoder may still be computing.

After the engine waited for rows, it gives its thread governor a fresh window only when
no fetch still waits for an item that has not arrived anywhere else (decoder_service.
engine): an image split over three chunks is three fetches that land milliseconds apart
once encoded, while a fetch of another item means an encoder still computes. The fetches
here are scripted: each resolves when the test lets its item arrive, so the order is the
test's, not the machine's.
"""

from __future__ import annotations

import asyncio

from decoder_service.prefetch import Prefetcher
from decoder_service.request import DecodeSpec, MediaSource, RequestState, SamplingOptions
from tessera.placeholders import Modality, PlaceholderRange

HASH_A = "a" * 64
HASH_B = "b" * 64


class ScriptedFetches:
    """Fetches that end when the test lets them: all of an item's (`arrive`), or the one
    fetching the item's rows from `row_start` (`release`)."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, int], asyncio.Event] = {}

    def event(self, content_hash: str, row_start: int) -> asyncio.Event:
        return self.events.setdefault((content_hash, row_start), asyncio.Event())

    async def fetch_chunk(self, request_id, items, slices) -> list:
        for item_slice in slices:
            await self.event(item_slice.content_hash, item_slice.row_start).wait()
        return []


def request_with(items: list[tuple[str, int, int]], chunk: int) -> RequestState:
    """A prompt of 64 tokens holding items (content hash, offset, length)."""
    sources = tuple(
        MediaSource(PlaceholderRange(Modality.IMAGE, h, offset, length), ("e:1",), b"")
        for h, offset, length in items
    )
    spec = DecodeSpec("r", tuple(range(64)), sources, SamplingOptions(max_tokens=1), chunk)
    return RequestState(spec, asyncio.Queue(), None)


async def planned(requests: list[RequestState]) -> tuple[Prefetcher, ScriptedFetches]:
    fetches = ScriptedFetches()
    prefetcher = Prefetcher(fetches, max_bytes=1 << 30, row_bytes=4)
    for request in requests:
        prefetcher.plan(request)
    await asyncio.sleep(0)  # every fetch starts and waits for its item
    return prefetcher, fetches


async def release(fetches: ScriptedFetches, content_hash: str, row_start: int) -> None:
    fetches.event(content_hash, row_start).set()
    for _ in range(3):  # the fetch waiting on it finishes
        await asyncio.sleep(0)


async def arrive(fetches: ScriptedFetches, content_hash: str) -> None:
    for name, row_start in list(fetches.events):
        if name == content_hash:
            await release(fetches, name, row_start)


def test_an_item_split_over_chunks_has_arrived_once_any_of_its_fetches_has():
    async def scenario() -> list[bool]:
        request = request_with([(HASH_A, 4, 40)], chunk=16)  # chunks 0-16, 16-32, 32-48
        prefetcher, fetches = await planned([request])
        assert len(request.fetches) == 3
        seen = [prefetcher.items_all_arrived([request])]
        # The chunk 16-32 holds rows 12-28 of the item: it lands first, the fetches of
        # rows 0-12 and 28-40 still wait, only for transfer now.
        await release(fetches, HASH_A, 12)
        assert sum(task.done() for task in request.fetches.values()) == 1
        seen.append(prefetcher.items_all_arrived([request]))
        return seen

    assert asyncio.run(scenario()) == [False, True]


def test_a_fetch_of_an_item_not_yet_arrived_anywhere_means_an_encoder_still_computes():
    async def scenario() -> list[bool]:
        first = request_with([(HASH_A, 0, 8)], chunk=16)
        other = request_with([(HASH_B, 0, 8)], chunk=16)
        prefetcher, fetches = await planned([first, other])
        await arrive(fetches, HASH_A)
        seen = [prefetcher.items_all_arrived([first, other])]
        seen.append(prefetcher.items_all_arrived([first]))  # only the request with A
        await arrive(fetches, HASH_B)
        seen.append(prefetcher.items_all_arrived([first, other]))
        return seen

    assert asyncio.run(scenario()) == [False, True, True]


def test_taken_rows_leave_no_trace():
    """A fetch whose rows a forward took is forgotten with its bytes."""

    async def scenario() -> tuple[bool, int]:
        request = request_with([(HASH_A, 0, 8)], chunk=16)
        prefetcher, fetches = await planned([request])
        await arrive(fetches, HASH_A)
        prefetcher.take(request, 0, 16)
        return prefetcher.items_all_arrived([request]), prefetcher.num_pending_bytes

    assert asyncio.run(scenario()) == (True, 0)


def test_an_item_whose_rows_a_forward_took_is_not_encoding_while_its_next_chunks_transfer():
    """The fetch of rows 0-12 landed and its forward took them; the fetches of the item's
    later chunks still transfer. No encoder computes the item: the engine neither tells
    one it idles for it nor keeps its thread governor's window for it."""

    async def scenario() -> bool:
        request = request_with([(HASH_A, 4, 40)], chunk=16)  # chunks 0-16, 16-32, 32-48
        prefetcher, fetches = await planned([request])
        await release(fetches, HASH_A, 0)
        assert prefetcher.refresh(request, 0.0) is None  # the step sees chunk 0-16 ready
        prefetcher.take(request, 0, 16)
        assert len(request.fetches) == 2 and not any(t.done() for t in request.fetches.values())
        return prefetcher.items_all_arrived([request])

    assert asyncio.run(scenario())
