"""The gateway sends a request to its decoder only once the encoders have its items in
flight (the encoder announces them with early initial metadata): the decoder's first
fetch then finds every item, and never sends an item's bytes to be encoded a second
time beside the gateway's Encode."""

from __future__ import annotations

import asyncio

from gateway.encode_dispatch import Countdown, until_dispatched
from tessera.client import Client, Message
from tessera.testbed.reference import noise_image
from tessera.v1 import common_pb2

NUM_REQUESTS = 6


def test_a_fresh_item_reaches_the_encoder_once_per_request(cluster):
    # Large noise images: the gateway's Encode carries ~1 MiB each, so a decode request
    # sent beside it (not after its announcement) would often be fetched from first.
    sampling = common_pb2.SamplingParams(max_tokens=2)
    with Client(cluster.address("gateway")) as client:
        for index in range(NUM_REQUESTS):
            images = [noise_image(9100 + 2 * index + k, 600, 560) for k in range(2)]
            messages = [Message("user", ["Compare", images[0], "with", images[1]])]
            done = client.complete(messages, sampling, 64, cache_salt=f"dispatch-{index}")
            assert done.stats.decoder.num_reencoded_items == 0, index


def test_the_wait_ends_when_every_encode_announced_or_ended():
    """Two Encode calls: the decode request waits for both announcements; an encoder
    that never announces (an older one) ends the wait when its call ends."""

    async def scenario() -> None:
        dispatched = asyncio.Event()
        countdown = Countdown(2, dispatched)
        first, second = countdown.one(), countdown.one()
        first()
        first()  # a party counts once
        assert not dispatched.is_set()
        second()
        assert dispatched.is_set()
        encode_ended = asyncio.get_running_loop().create_future()
        encode_ended.set_result([])
        await asyncio.wait_for(until_dispatched(asyncio.Event(), encode_ended), 30)

    asyncio.run(scenario())
