"""Sending an item to an encoder again, once per encoder however many fetches need it.

An encoder that answers a fetch with NOT_FOUND (the gateway's Encode has not arrived
there, it evicted the item, or it is another replica) is sent the item's bytes from the
decode request to encode, and asked again. Fetches of other chunks of the same item that
find it missing on the same encoder wait for that one call instead of sending their own.
The call is made as the gateway makes it (`tessera.encode_call`), so `on_announced`
hears as soon as the encoder has the item in flight (decoder_service.expedite names it
to that encoder then).

A fetch that moves on past encoders that failed (down, unreachable) finds the item where
the gateway's Encode went when it met the same failures: the next encoder of the same
order. While such a fetch waits there, that encoder computes the item for this decoder,
and `on_announced` hears of it as it moves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from decoder_service.request import MediaSource
from tessera.encode_call import encode_announced
from tessera.replicas import ReplicaSet
from tessera.v1 import encoder_pb2
from tessera.wire import media_item_to_proto

log = logging.getLogger("tessera.decoder.fetch")


class Reencoder:
    """The Encode calls this decoder has in flight, and the fetches it moved on past a
    failed encoder, by (encoder address, content_hash)."""

    def __init__(
        self, encoders: ReplicaSet, lease_ms: int, timeout_seconds: float, model_fingerprint: str
    ):
        self.encoders = encoders
        self.lease_ms = lease_ms
        self.timeout_seconds = timeout_seconds
        # Named in the calls: the content hashes came from a gateway of this model (empty:
        # unknown, and the encoder checks every hash).
        self.model_fingerprint = model_fingerprint
        # Called with (encoder address, content_hash) once that encoder has the item in
        # flight.
        self.on_announced: Callable[[str, str], None] = lambda address, content_hash: None
        self._calls: dict[tuple[str, str], asyncio.Future] = {}
        self._moved: Counter[tuple[str, str]] = Counter()

    def computing_at(self, order: Sequence[str], content_hash: str) -> str | None:
        """The first address of `order` that computes the item for this decoder other than
        by default: its Encode from this decoder is in flight there, or a fetch of it
        moved on to there."""
        keys = ((address, content_hash) for address in order)
        return next((key[0] for key in keys if key in self._calls or self._moved[key]), None)

    @contextmanager
    def fetching(self, address: str, content_hash: str, moved: bool) -> Iterator[None]:
        """A fetch of the item from `address`; `moved`: the encoders before it in the
        item's order failed, so the item computes here."""
        if not moved:
            yield
            return
        key = (address, content_hash)
        self._moved[key] += 1
        self._announced(address, content_hash)
        try:
            yield
        finally:
            self._moved[key] -= 1
            if not self._moved[key]:
                del self._moved[key]

    async def encode_once(self, address: str, request_id: str, item: MediaSource) -> bool:
        """Sends the item to `address` to be encoded, unless a fetch of another chunk is
        already doing so; True if this call sent it."""
        content_hash = item.range.content_hash
        key = (address, content_hash)
        pending = self._calls.get(key)
        if pending is not None:
            await asyncio.shield(pending)
            return False
        log.info("item %s not on %s; sending it to be encoded", content_hash, address)
        request = encoder_pb2.EncodeRequest(
            items=[media_item_to_proto(item.range, item.data, item.options, item.cache_salt)],
            lease_owner=request_id,
            lease_ms=self.lease_ms,
            model_fingerprint=self.model_fingerprint,
        )
        task = asyncio.ensure_future(
            encode_announced(
                self.encoders.channel(address),
                request,
                self.timeout_seconds,
                lambda: self._announced(address, content_hash),
            )
        )
        self._calls[key] = task
        try:
            await asyncio.shield(task)
        finally:
            if self._calls.get(key) is task:
                del self._calls[key]
        return True

    def _announced(self, address: str, content_hash: str) -> None:
        """Advisory: a listener's error never fails the encode the fetch waits for."""
        try:
            self.on_announced(address, content_hash)
        except Exception:
            log.exception("telling of item %s in flight on %s failed", content_hash, address)
