"""Telling the encoders what this decoder idles for (`Expedite`).

An encoder sharing a host with decoders leaves them most of its CPUs; while a decoder
has nothing to run but waits for an item's rows, those CPUs idle and the item computes
on the encoder's few threads. The engine calls `idle_for` when its step has nothing to
run and items it fetches are still being encoded: each item's first-choice encoder
(where its fetch goes, and where the gateway sent it) hears which of its items this
decoder idles for, and runs them on more threads (encoder_service.expedite). When the
engine has work again, or none waits, it calls `not_idle`, and each encoder told of
items hears that it no longer idles: wide threads beside a busy decoder slow both.

Calls go out in the background with a short deadline; a failure only means the items
compute as they would have. An encoder hears only changes, and each call carries a
sequence number, so one overtaken on the way is ignored.

    idle for A (encoder e1) and B (e2) -> e1: [A], e2: [B]
    wakes for a new text prompt, runs it -> e1: [], e2: []
    idle for B                           -> e2: [B]

An encoder ignores items it does not have in flight. When the first choice lost an item
and this decoder sends it again (to it or the next encoder), the item computes where it
was sent: that encoder hears, as soon as it has the item in flight, what this decoder
still idles for there. When the first choice is down, the gateway's Encode and the
decoder's fetch both move on to the next encoder: that one hears it as the fetch gets
there (decoder_service.reencode).

    idle for A (e1 lost it)              -> e1: [A] (ignored: not in flight there)
    A sent to e1 again, in flight        -> e1: [A] (again, now heard)
    idle for B (e1 down, fetched at e2)  -> e2: [B]
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import uuid
from collections.abc import Callable, Sequence

import grpc

from decoder_service.embedding_client import EmbeddingClient
from decoder_service.request import MediaSource
from tessera.channels import ChannelPoolFullError
from tessera.limits import MAX_EXPEDITE_HASHES
from tessera.replicas import UnknownReplicaError
from tessera.v1 import encoder_pb2, encoder_pb2_grpc

log = logging.getLogger("tessera.decoder")

EXPEDITE_TIMEOUT_SECONDS = 1.0


def _advisory(method: Callable[..., None]) -> Callable[..., None]:
    """An error in telling the encoders is logged, never raised: the engine's step, which
    calls these, would otherwise fail every request it holds for a hint."""

    @functools.wraps(method)
    def guarded(*args, **kwargs) -> None:
        try:
            method(*args, **kwargs)
        except Exception:
            log.exception("Expedite bookkeeping failed (advisory: the engine goes on)")

    return guarded


class EncoderExpediter:
    """What this decoder told each encoder it idles for, and the calls that told it."""

    def __init__(self, embeddings: EmbeddingClient):
        self.embeddings = embeddings
        self.decoder_id = uuid.uuid4().hex
        self.num_calls = 0  # sent, answered or not
        self._sequence = itertools.count(1)
        self._told: dict[str, frozenset[str]] = {}  # encoder address -> what it last heard
        self._idle_for: tuple[MediaSource, ...] = ()  # since the last `idle_for`, if idle
        self._calls: set[asyncio.Task] = set()

    @_advisory
    def idle_for(self, items: Sequence[MediaSource]) -> None:
        """The engine has nothing to run until rows of `items` (still encoding) arrive."""
        if self.embeddings.colocated is not None:
            return
        self._idle_for = tuple(items)
        for address, content_hashes in self._by_address().items():
            self._tell(address, content_hashes)

    @_advisory
    def not_idle(self) -> None:
        """The engine has work again, or nothing waits."""
        self._idle_for = ()
        for address in list(self._told):
            self._tell(address, frozenset())

    @_advisory
    def now_computing(self, address: str, content_hash: str) -> None:
        """`address` now computes an item for this decoder (sent it again, or a fetch moved
        on to it): if the engine idles for it, that encoder hears so, again if it heard
        before (it ignored the item until it had it in flight)."""
        if not any(item.range.content_hash == content_hash for item in self._idle_for):
            return
        content_hashes = self._by_address().get(address, frozenset())  # none: it left
        if content_hash in content_hashes:
            self._tell(address, content_hashes, again=True)

    def _by_address(self) -> dict[str, frozenset[str]]:
        """Encoder address -> the items idled for that it computes (every encoder told
        before: an empty set for those no longer computing any)."""
        by_address: dict[str, set[str]] = {address: set() for address in self._told}
        for item in self._idle_for:
            address = self.embeddings.computing_at(item)
            if address is not None:
                by_address.setdefault(address, set()).add(item.range.content_hash)
        return {
            address: frozenset(sorted(content_hashes)[:MAX_EXPEDITE_HASHES])
            for address, content_hashes in by_address.items()
        }

    def _tell(self, address: str, content_hashes: frozenset[str], again: bool = False) -> None:
        if self._told.get(address, frozenset()) == content_hashes and not again:
            return
        if content_hashes:
            self._told[address] = content_hashes
        else:
            self._told.pop(address, None)
        call = asyncio.create_task(self._send(address, content_hashes, next(self._sequence)))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

    async def _send(self, address: str, content_hashes: frozenset[str], sequence: int) -> None:
        self.num_calls += 1
        request = encoder_pb2.ExpediteRequest(
            content_hashes=sorted(content_hashes), decoder_id=self.decoder_id, sequence=sequence
        )
        try:
            stub = encoder_pb2_grpc.EncoderServiceStub(self.embeddings.encoders.channel(address))
            await stub.Expedite(request, timeout=EXPEDITE_TIMEOUT_SECONDS)
        except (grpc.aio.AioRpcError, ChannelPoolFullError, UnknownReplicaError) as error:
            log.debug("Expedite to %s failed: %s", address, error)
