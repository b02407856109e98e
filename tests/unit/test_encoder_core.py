"""EncoderCore's single-flight and batching, with a stand-in model family whose encode
can be held, so the interleavings under test happen for certain."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
import torch

from encoder_service.encoder import EncoderCore
from encoder_service.items import EncodeItem, InvalidItemError, RowRequest, UnknownItemError
from encoder_service.memory_store import Lease, MemoryStore
from tessera.adapters import MediaInput
from tessera.media import ProcessingOptions, decode_image
from tessera.media_decoder import MediaLimits
from tessera.placeholders import Modality
from tessera.tensor_codec import encode_rows
from tessera.testbed.reference import noise_image

FINGERPRINT = "f" * 32


class HeldFamily:
    """Encodes each image to 4 rows of its first pixel values; waits for `release`."""

    modalities = frozenset({Modality.IMAGE})
    fingerprint = FINGERPRINT
    processed_pixels_shape = None  # takes files only

    def __init__(self) -> None:
        self.release = threading.Event()
        self.batches: list[int] = []

    def check_options(self, options: ProcessingOptions) -> None:
        if options.values:
            raise ValueError("takes no options")

    def encode(self, items: Sequence[MediaInput]) -> list[torch.Tensor]:
        assert self.release.wait(10)
        self.batches.append(len(items))
        return [torch.full((4, 8), float(item.image.image.getpixel((0, 0))[0])) for item in items]


def item(seed: int) -> EncodeItem:
    data = noise_image(seed, 20, 20)
    return EncodeItem(decode_image(data).content_hash(FINGERPRINT), Modality.IMAGE, data)


def core(family: HeldFamily, max_batch_items: int = 8) -> EncoderCore:
    return EncoderCore(family, MemoryStore(1 << 20), max_batch_items, 50.0, MediaLimits(10**6))


def test_a_slice_request_waits_for_the_encode_in_flight():
    async def scenario() -> None:
        family = HeldFamily()
        encoder = core(family)
        wanted = item(1)
        encode = asyncio.create_task(encoder.encode([wanted], None))
        await asyncio.sleep(0.05)
        rows = asyncio.create_task(
            encoder.resolve_slices([RowRequest(wanted.content_hash, 1, 3)], None)
        )
        await asyncio.sleep(0.05)
        assert not rows.done()  # waiting, not NOT_FOUND
        family.release.set()
        (block,) = await rows
        assert block.num_rows == 2
        await encode
        assert encoder.counters.num_items_computed == 1

    asyncio.run(scenario())


def test_concurrent_requests_for_one_item_compute_once_and_items_batch_together():
    async def scenario() -> None:
        family = HeldFamily()
        encoder = core(family)
        first, second = item(2), item(3)
        calls = [encoder.encode([first, second], Lease("r", 60)) for _ in range(5)]
        tasks = [asyncio.create_task(c) for c in calls]
        await asyncio.sleep(0.05)
        family.release.set()
        results = await asyncio.gather(*tasks)
        assert encoder.counters.num_items_computed == 2
        assert family.batches == [2]  # both items in one forward
        sources = [r.source.value for result in results for r in result]
        assert sources.count("computed") == 2 and sources.count("joined") == 8

    asyncio.run(scenario())


def test_unknown_item_is_not_found():
    async def scenario() -> None:
        encoder = core(HeldFamily())
        with pytest.raises(UnknownItemError):
            await encoder.resolve_slices([RowRequest("ab" * 32, 0, 1)], None)

    asyncio.run(scenario())


def test_a_cancelled_request_does_not_cancel_the_shared_computation():
    async def scenario() -> None:
        family = HeldFamily()
        encoder = core(family)
        wanted = item(4)
        impatient = asyncio.create_task(encoder.encode([wanted], None))
        patient = asyncio.create_task(encoder.encode([wanted], None))
        await asyncio.sleep(0.05)
        impatient.cancel()
        family.release.set()
        (result,) = await patient
        assert result.block.num_rows == 4
        assert encoder.counters.num_items_computed == 1

    asyncio.run(scenario())


def test_one_call_materialises_at_most_its_byte_budget():
    async def scenario() -> None:
        family = HeldFamily()
        family.release.set()
        encoder = core(family)
        wanted = item(4)
        await encoder.encode([wanted], None)
        whole = RowRequest(wanted.content_hash, 0, 4)  # 4 rows x 8 float32 = 128 bytes
        assert len(await encoder.resolve_slices([whole] * 2, None, max_bytes=256)) == 2
        with pytest.raises(ValueError, match="--max-slice-bytes-per-call"):
            await encoder.resolve_slices([whole] * 3, None, max_bytes=256)

    asyncio.run(scenario())


def test_other_bytes_under_a_hash_fail_alone_and_reveal_nothing():
    """A caller names the victim's hash with other bytes and starts first: the victim's
    Encode and slice request, which join that computation, still get the victim's rows."""

    async def scenario() -> None:
        family = HeldFamily()
        encoder = core(family)
        victim = item(5)
        forged = EncodeItem(victim.content_hash, Modality.IMAGE, noise_image(6, 20, 20))
        attack = asyncio.create_task(encoder.encode([forged], None))
        await asyncio.sleep(0)  # the forged computation is in flight first
        honest = asyncio.create_task(encoder.encode([victim], None))
        rows = asyncio.create_task(
            encoder.resolve_slices([RowRequest(victim.content_hash, 0, 2)], None)
        )
        await asyncio.sleep(0.05)
        family.release.set()
        with pytest.raises(InvalidItemError) as refused:
            await attack
        assert "does not match" in str(refused.value)
        real_hash = decode_image(forged.data).content_hash(FINGERPRINT)
        assert real_hash not in str(refused.value), "the true hash is not revealed"
        (result,) = await honest
        assert result.source.value == "computed"
        expected = float(decode_image(victim.data).image.getpixel((0, 0))[0])
        assert result.block.rows(0, 1).data == encode_rows(torch.full((1, 8), expected)).data
        try:
            (block,) = await rows
        except UnknownItemError:  # also fine: the decoder then sends its own bytes
            return
        assert block.num_rows == 2

    asyncio.run(scenario())


def test_a_trusted_callers_hash_is_taken_as_given_and_anyone_elses_is_checked():
    """Trust means the pixels are not hashed at all: rows of other bytes are filed under
    the name a trusted caller gave (the risk docs/security.md states); the same item from
    anyone else is refused."""

    async def scenario() -> None:
        family = HeldFamily()
        family.release.set()
        encoder = core(family)
        named = item(7).content_hash
        other_bytes = noise_image(8, 20, 20)
        untrusted = EncodeItem(named, Modality.IMAGE, other_bytes)
        with pytest.raises(InvalidItemError, match="does not match"):
            await encoder.encode([untrusted], None)
        assert (encoder.counters.num_hashes_verified, encoder.counters.num_hashes_trusted) == (1, 0)

        trusted = EncodeItem(named, Modality.IMAGE, other_bytes, hash_trusted=True)
        (result,) = await encoder.encode([trusted], None)
        assert result.source.value == "computed"
        assert (encoder.counters.num_hashes_verified, encoder.counters.num_hashes_trusted) == (1, 1)
        first_pixel = float(decode_image(other_bytes).image.getpixel((0, 0))[0])
        assert result.block.rows(0, 1).data == encode_rows(torch.full((1, 8), first_pixel)).data

        # Served from memory afterwards: the bytes are not used, so neither is counted.
        await encoder.encode([untrusted], None)
        assert (encoder.counters.num_hashes_verified, encoder.counters.num_hashes_trusted) == (1, 1)

    asyncio.run(scenario())
