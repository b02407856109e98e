"""The order of a request's two dispatches: the decode request goes to a decoder only
once every encoder has announced the request's items in flight (`Encode`'s early initial
metadata), so the decoder's first fetch finds them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from tessera.encode_call import encode_announced
from tessera.v1 import encoder_pb2
from tessera.wire import FILES_WANTED_KEY

log = logging.getLogger("tessera.gateway")


class Countdown:
    """Sets `done` once each of `count` parties has ticked (`one()`: a party's tick,
    counted once however often it is called)."""

    def __init__(self, count: int, done: asyncio.Event):
        self.count, self.done = count, done

    def one(self) -> Callable[[], None]:
        ticked = False

        def tick() -> None:
            nonlocal ticked
            if not ticked:
                ticked = True
                self.count -= 1
                if self.count <= 0:
                    self.done.set()

        return tick


async def until_dispatched(dispatched: asyncio.Event, encode_task: asyncio.Task) -> None:
    """Until the encoders have the request's items in flight, so the decode request goes
    out only then: a decoder fetching sooner can find nothing and send each item's bytes
    to be encoded a second time (docs/design.md, data flow step 2, says when it did). An
    encoder that does not announce (an older one) ends the wait when its Encode ends."""
    if dispatched.is_set():
        return
    waiter = asyncio.ensure_future(dispatched.wait())
    try:
        await asyncio.wait([waiter, encode_task], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def wants_files(error: grpc.aio.AioRpcError) -> bool:
    """An Encode refused because it sent pixel values in place of files to an encoder
    that does not trust this gateway's content hashes (encoder_service/processed_pixels.py)."""
    return error.code() == grpc.StatusCode.FAILED_PRECONDITION and any(
        key == FILES_WANTED_KEY for key, _ in error.trailing_metadata() or ()
    )


async def encode_at(
    channel: grpc.aio.Channel,
    address: str,
    request_for: Callable[[bool], encoder_pb2.EncodeRequest],
    timeout: float | None,
    announced: Callable[[], None],
    files_wanted: set[str],
) -> encoder_pb2.EncodeResponse:
    """`encode_announced` at `address` of `request_for(with_pixel_values)`: large images
    as pixel values, unless that encoder asked for files (then it is added to
    `files_wanted`, and the same Encode sent again with files)."""
    with_pixels = address not in files_wanted
    try:
        return await encode_announced(channel, request_for(with_pixels), timeout, announced)
    except grpc.aio.AioRpcError as error:
        if not (with_pixels and wants_files(error)):
            raise
    log.warning(
        "encoder %s does not trust this gateway's content hashes: it gets files from now "
        "on, not processed images (does its --trust-content-hashes-from name this "
        "gateway's certificate?)",
        address,
    )
    files_wanted.add(address)
    return await encode_announced(channel, request_for(False), timeout, announced)
