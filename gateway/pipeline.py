"""One chat request through the system: build the prompt, send its items to encoders and
the prompt to a decoder at the same time, turn tokens into text."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from gateway.detokenizer import IncrementalDetokenizer
from gateway.encode_dispatch import Countdown, encode_at, until_dispatched
from gateway.prompt import ChatInput, Prompt, PromptBuilder, PromptItem
from gateway.resume import as_one_answer, can_resume, continuation
from gateway.router import DecoderRouter
from tessera.channels import ChannelPool
from tessera.compute_thread import compute_thread
from tessera.rendezvous import encoder_order
from tessera.replicas import ReplicaSet
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2
from tessera.video import MAX_CONCURRENT_VIDEO_DECODES
from tessera.wire import media_item_to_proto, range_to_proto

log = logging.getLogger("tessera.gateway")

# Served by the encoder's memory tier: found there, or joined an encode in flight there.
_MEMORY_SOURCES = (encoder_pb2.ENCODE_SOURCE_MEMORY, encoder_pb2.ENCODE_SOURCE_JOINED)
# Failures that say "this replica", not "this request": try another one.
_REPLICA_FAILURES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN}


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    messages: Sequence[ChatInput]
    sampling: common_pb2.SamplingParams
    max_chunk_tokens: int
    timeout_seconds: float | None
    cache_salt: str = ""
    processing_options: Mapping[str, int] = field(default_factory=dict)
    tools: Sequence[dict] = ()  # for the chat template, OpenAI's shape
    prompt_token_ids: Sequence[int] | None = None  # instead of messages when set


@dataclass(frozen=True)
class TextEvent:
    text: str
    tokens: decoder_pb2.TokenBatch


@dataclass(frozen=True)
class ItemSources:
    """Where the encoders found a request's unique media items (each Encode's answer)."""

    memory: int = 0  # the encoder's memory cache (or an encode of it already in flight)
    redis: int = 0  # the shared Redis tier
    computed: int = 0  # encoded afresh

    @property
    def cached(self) -> int:
        return self.memory + self.redis

    @staticmethod
    def of(encoded: Sequence[encoder_pb2.EncodedItem]) -> ItemSources:
        return ItemSources(
            memory=sum(e.source in _MEMORY_SOURCES for e in encoded),
            redis=sum(e.source == encoder_pb2.ENCODE_SOURCE_REDIS for e in encoded),
            computed=sum(e.source == encoder_pb2.ENCODE_SOURCE_COMPUTED for e in encoded),
        )


@dataclass(frozen=True)
class FinishedEvent:
    prompt: Prompt
    decoder: decoder_pb2.DecodeFinished
    token_ids: list[int]
    time_to_first_token_seconds: float
    sources: ItemSources

    @property
    def num_items_computed(self) -> int:
        return self.sources.computed

    @property
    def num_items_cached(self) -> int:
        return self.sources.cached


# Longer than the channels' longest reconnect backoff (1 s, tessera.channels, plus its
# 20% jitter): a decoder that is back is connected within it.
CONNECT_WAIT_SECONDS = 1.5


async def wait_connected(channel: grpc.aio.Channel, max_seconds: float) -> None:
    """Waits, at most `max_seconds`, for a channel that is not READY to connect. A call on
    a channel between reconnect attempts fails at once; a decoder that came back a moment
    ago would fail the request that way although it is about to be reached. A peer still
    down costs the wait, then fails the call as before (and is set aside)."""
    if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(channel.channel_ready(), max_seconds)


class DownstreamError(Exception):
    """A backend failed; carries the status to give the client."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class GenerationPipeline:
    def __init__(
        self,
        builder: PromptBuilder,
        encoders: ReplicaSet,
        decoders: DecoderRouter,
        channels: ChannelPool,
        lease_ms: int,
    ):
        self.builder = builder
        self.encoders = encoders
        self.decoders = decoders
        self.channels = channels
        self.lease_ms = lease_ms
        # Video decoding (PyAV releases the GIL): a few at a time, beside the compute
        # thread, so one long video never holds up another request's prompt.
        self.video_executor = ThreadPoolExecutor(
            max_workers=MAX_CONCURRENT_VIDEO_DECODES, thread_name_prefix="video"
        )
        # Told where each request's items were found, once its Encode calls answer
        # (whether or not the request still runs then): the encoder cache metrics.
        self.encoded_listeners: list[Callable[[ItemSources], None]] = []
        # Encoders that refused pixel values (they do not trust this gateway's hashes).
        self.files_wanted: set[str] = set()

    @staticmethod
    def new_request_id() -> str:
        return uuid.uuid4().hex

    @staticmethod
    def internal_id(client_id: str) -> str:
        """The id a request has downstream (decoder key, owner of its encoder pins): the
        client's id as a label plus 128 random bits, so a client (or a proxy retrying)
        that reuses an id never collides with a request still running, and nobody who
        was not told the id can release or renew the request's pins.

        Example: "chat-7" -> "chat-7.3f9c2a1b5d7e4f60a1b2c3d4e5f60718"
        """
        return f"{client_id[:64]}.{uuid.uuid4().hex}"

    async def run(
        self, request: GenerationRequest
    ) -> AsyncIterator[Prompt | TextEvent | FinishedEvent]:
        """The prompt as built, then text as it comes, then the end."""
        started = time.monotonic()
        if request.prompt_token_ids is not None:
            prompt = self.builder.from_token_ids(request.prompt_token_ids)
        else:
            videos = None
            if any(m.has_video for m in request.messages):
                # Long work without torch: on threads of its own, not the compute thread.
                videos = await asyncio.get_running_loop().run_in_executor(
                    self.video_executor,
                    self.builder.decode_videos,
                    request.messages,
                    request.processing_options,
                )
            # The processor's torch ops, on the one thread that runs them (compute_thread).
            prompt = await compute_thread().run(
                self.builder.build,
                request.messages,
                request.processing_options,
                request.cache_salt,
                request.tools,
                videos,
            )
        yield prompt
        dispatched = asyncio.Event()
        encode_task = asyncio.create_task(self._encode_all(request, prompt.items, dispatched))
        encode_task.add_done_callback(self._tell_encoded)
        detokenizer = IncrementalDetokenizer(self.builder.family.decode_tokens)
        token_ids: list[int] = []
        first_token_time: float | None = None
        try:
            await until_dispatched(dispatched, encode_task)
            async for message in self._decode(request, prompt, encode_task):
                if message.HasField("tokens"):
                    first_token_time = first_token_time or time.monotonic()
                    token_ids += message.tokens.token_ids
                    yield TextEvent(detokenizer.add(message.tokens.token_ids), message.tokens)
                    continue
                tail = detokenizer.flush()
                if tail:
                    yield TextEvent(tail, decoder_pb2.TokenBatch())
                sources = await self._encode_outcome(encode_task)
                ttft = (first_token_time or time.monotonic()) - started
                yield FinishedEvent(prompt, message.finished, token_ids, ttft, sources)
        finally:
            # Encoding goes on (the cache keeps the result); its error is not news then.
            encode_task.add_done_callback(lambda task: task.cancelled() or task.exception())

    def _tell_encoded(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        sources = ItemSources.of(task.result())
        for listener in self.encoded_listeners:
            listener(sources)

    async def _decode(
        self, request: GenerationRequest, prompt: Prompt, encode_task: asyncio.Task
    ) -> AsyncIterator[decoder_pb2.DecodeResponse]:
        """The decoder's stream. A decoder that fails is set aside and the request tried
        once more elsewhere: from the start if no token came yet, else resumed after the
        tokens the client has (gateway.resume), where that gives the same answer. Any
        other failure goes to the client (never a silently truncated answer)."""
        decode_request = self._decode_request(request, prompt)
        tried: list[str] = []
        generated: list[int] = []
        while True:
            address = self.decoders.acquire(exclude=tried)
            if address is None:
                raise DownstreamError(grpc.StatusCode.UNAVAILABLE, "no decoder is reachable")
            tried.append(address)
            channel = self.channels.get(address)
            await wait_connected(channel, CONNECT_WAIT_SECONDS)
            stub = decoder_pb2_grpc.DecoderServiceStub(channel)
            sent = continuation(decode_request, generated) if generated else decode_request
            num_resumed = len(generated)
            call = stub.Generate(sent, timeout=request.timeout_seconds)
            try:
                async for message in call:
                    if message.HasField("tokens"):
                        generated += message.tokens.token_ids
                    as_one_answer(message, num_resumed)
                    yield message
                return
            except grpc.aio.AioRpcError as error:
                retry = not generated or can_resume(decode_request.sampling)
                if retry and error.code() in _REPLICA_FAILURES and len(tried) < 2:
                    self.decoders.replicas.mark_down(address, error.code().name)
                    continue
                # A bad item makes both the encoder and the decoder fail; the encoder's
                # error says what is wrong with the input.
                if encode_task.done() and isinstance(encode_task.exception(), DownstreamError):
                    raise encode_task.exception() from None
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # The decoder is fine; the item's encoders could not serve its rows.
                    raise DownstreamError(
                        grpc.StatusCode.UNAVAILABLE, f"encoders: {error.details()}"
                    ) from None
                if retry and error.code() in _REPLICA_FAILURES:  # every decoder tried failed
                    # The client is told what happened, not the fleet's internal addresses.
                    log.warning(
                        "request %s: decoders %s failed: %s",
                        request.request_id,
                        ", ".join(tried),
                        error.details(),
                    )
                    raise DownstreamError(
                        error.code(), f"no decoder answered ({len(tried)} tried); retry shortly"
                    ) from None
                raise DownstreamError(error.code(), f"decoder: {error.details()}") from None
            finally:
                call.cancel()
                self.decoders.release(address)

    def _decode_request(
        self, request: GenerationRequest, prompt: Prompt
    ) -> decoder_pb2.DecodeRequest:
        # Each item's bytes go once: the decoder gives later ranges of the same content
        # hash (one video's frames, an image sent twice) the first one's.
        sent: set[str] = set()
        sources = []
        for item in prompt.items:
            name = item.range.content_hash
            sources.append(
                decoder_pb2.MediaSource(
                    range=range_to_proto(item.range),
                    encoder_addresses=encoder_order(name, self.encoders),
                    data=b"" if name in sent else item.data,
                    processing_options=item.options.as_dict(),
                )
            )
            sent.add(name)
        return decoder_pb2.DecodeRequest(
            request_id=request.request_id,
            prompt_token_ids=prompt.token_ids,
            items=sources,
            sampling=request.sampling,
            max_chunk_tokens=request.max_chunk_tokens,
            cache_salt=request.cache_salt,
        )

    async def _encode_all(
        self, request: GenerationRequest, items: Sequence[PromptItem], dispatched: asyncio.Event
    ) -> list:
        """One Encode per encoder over its unique items; returns the EncodedItem messages.
        `dispatched` is set once every call's encoder has its items in flight (or the call
        ended). With no encoder known (a gateway in front of --colocated-encoder
        decoders, or none discovered), nothing is sent: the decoder has every item's
        bytes and gets its rows itself, or says clearly that it cannot."""
        if not self.encoders.addresses or not items:
            dispatched.set()
            return []
        by_encoder: dict[str, dict[str, PromptItem]] = {}
        for item in items:
            address = encoder_order(item.range.content_hash, self.encoders)[0]
            by_encoder.setdefault(address, {})[item.range.content_hash] = item
        countdown = Countdown(len(by_encoder), dispatched)
        calls = [
            self._encode_on(address, request, list(unique.values()), countdown.one())
            for address, unique in by_encoder.items()
        ]
        results = await asyncio.gather(*calls)
        return [encoded for response in results for encoded in response.items]

    async def _encode_on(
        self,
        address: str,
        generation: GenerationRequest,
        items: list[PromptItem],
        announced: Callable[[], None],
    ):
        """Encode on `address`, or on the next encoders in rank if it is unreachable.
        Calls `announced` once: when an encoder has the items in flight (its early
        initial metadata), or when the call ends without that."""
        order = encoder_order(items[0].range.content_hash, self.encoders)
        candidates = [address, *[a for a in order if a != address]]
        request_for = functools.partial(self._encode_request, generation, items)
        try:
            for candidate in candidates:
                channel = self.channels.get(candidate)
                try:
                    return await encode_at(
                        channel,
                        candidate,
                        request_for,
                        generation.timeout_seconds,
                        announced,
                        self.files_wanted,
                    )
                except grpc.aio.AioRpcError as error:
                    if error.code() not in _REPLICA_FAILURES or candidate == candidates[-1]:
                        raise DownstreamError(
                            error.code(), f"encoder {candidate}: {error.details()}"
                        ) from None
                    self.encoders.mark_down(candidate, error.code().name)
            raise AssertionError("unreachable")
        finally:
            announced()

    def _encode_request(
        self, generation: GenerationRequest, items: list[PromptItem], with_pixel_values: bool
    ) -> encoder_pb2.EncodeRequest:
        salt = generation.cache_salt
        return encoder_pb2.EncodeRequest(
            items=[
                media_item_to_proto(
                    i.range, i.data, i.options, salt, i.pixel_values if with_pixel_values else None
                )
                for i in items
            ],
            lease_owner=generation.request_id,
            lease_ms=self.lease_ms,
            # What the hashes were made with: an encoder that trusts this gateway's
            # hashes (mutual TLS) then skips hashing the pixels again, and one serving
            # another model refuses instead of filing its rows under these names.
            model_fingerprint=self.builder.family.fingerprint,
        )

    async def _encode_outcome(self, encode_task: asyncio.Task) -> ItemSources:
        """Where the unique items came from. The decoder finished, so every item was
        encoded somewhere: a failed Encode here only means the decoder had it re-encoded."""
        try:
            encoded = await encode_task
        except DownstreamError as error:
            log.warning("Encode failed but the decoder recovered: %s", error)
            return ItemSources()
        return ItemSources.of(encoded)
