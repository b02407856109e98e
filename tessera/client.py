"""Small clients for the gateway's gRPC API: `Client` (blocking) and `AsyncClient`.

    with Client("127.0.0.1:50051") as client:
        answer = client.complete([Message("user", [png_bytes, "What is this?"])])
        print(answer.text)

A gateway with mutual TLS wants a client certificate (role `client`, see README):

    Client("localhost:50051", tls=TlsFiles("client.pem", "client.key", "ca.pem"))

The files are read once, when the client is made. A gateway with API keys wants one:

    Client("127.0.0.1:50051", api_key="...")

Every call has a deadline (`timeout_seconds`). A call that fails before any output with
UNAVAILABLE (no gateway there, or it is restarting) or RESOURCE_EXHAUSTED (queue full) is
retried up to `max_retries` times with backoff: nothing was generated for the caller, so
retrying is safe. Once output has arrived, errors go to the caller.

Sampling parameters are typed (`SamplingParams`, `StructuredOutput`; protobuf ones are
still taken), `deltas()` streams typed `Delta`s, and every failure is a `TesseraError`
(`InvalidRequest`, `Unauthenticated`, `Unavailable`, `DeadlineExceeded`, ...), which is
still a `grpc.RpcError` with `code()` and `details()`.

This module must stay light (no torch, transformers or numpy): `tessera generate` and
applications import it; tests/unit/test_light_imports.py checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from tessera.client_types import (
    Cancelled,
    DeadlineExceeded,
    Delta,
    InvalidRequest,
    NotFound,
    Overloaded,
    PermissionDenied,
    SamplingParams,
    ServerError,
    StructuredOutput,
    TesseraError,
    TokenLogprob,
    TopLogprob,
    Unauthenticated,
    Unavailable,
    Usage,
    client_error,
    delta_from_response,
    finish_reason_name,
    sampling_proto,
)
from tessera.server import GRPC_OPTIONS
from tessera.tls import TlsFiles, aio_channel, sync_channel
from tessera.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

__all__ = [
    "AsyncClient",
    "Audio",
    "Cancelled",
    "Client",
    "Completion",
    "DeadlineExceeded",
    "Delta",
    "InvalidRequest",
    "Message",
    "NotFound",
    "Overloaded",
    "PermissionDenied",
    "SamplingParams",
    "ServerError",
    "StructuredOutput",
    "TesseraError",
    "TlsFiles",
    "TokenLogprob",
    "TopLogprob",
    "Unauthenticated",
    "Unavailable",
    "Usage",
    "Video",
    "build_request",
]

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
REQUEST_ID_KEY = "x-request-id"


@dataclass(frozen=True)
class Audio:
    """A message part holding an encoded audio file (WAV, FLAC, OGG, MP3, ...)."""

    data: bytes


@dataclass(frozen=True)
class Video:
    """A message part holding an encoded video file (MP4, WebM, Matroska, QuickTime)."""

    data: bytes


@dataclass(frozen=True)
class Message:
    """A chat message: `parts` are strings (text), bytes (an encoded image), Audio or
    Video."""

    role: str
    parts: Sequence[str | bytes | Audio | Video]

    def to_proto(self) -> gateway_pb2.ChatMessage:
        return gateway_pb2.ChatMessage(role=self.role, content=[_part(p) for p in self.parts])


def _part(part: str | bytes | Audio | Video) -> gateway_pb2.ContentPart:
    if isinstance(part, str):
        return gateway_pb2.ContentPart(text=part)
    if isinstance(part, Audio):
        return gateway_pb2.ContentPart(audio=part.data)
    if isinstance(part, Video):
        return gateway_pb2.ContentPart(video=part.data)
    return gateway_pb2.ContentPart(image=part)


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    usage: dict[str, int]
    stats: gateway_pb2.RequestStats
    logprobs: list[common_pb2.TokenLogprobs] = field(default_factory=list)


def build_request(
    messages: Sequence[Message],
    sampling: SamplingParams | common_pb2.SamplingParams | None = None,
    max_chunk_tokens: int = 0,
    request_id: str = "",
    cache_salt: str = "",
    stop: Sequence[str] = (),
    model: str = "",
    mm_processor_kwargs: Mapping[str, int] | None = None,
) -> gateway_pb2.GenerateRequest:
    """`mm_processor_kwargs`: processor settings for the media, e.g. {"max_pixels": N}."""
    return gateway_pb2.GenerateRequest(
        request_id=request_id,
        messages=[m.to_proto() for m in messages],
        sampling=sampling_proto(sampling),
        max_chunk_tokens=max_chunk_tokens,
        cache_salt=cache_salt,
        stop=list(stop),
        model=model,
        mm_processor_kwargs=dict(mm_processor_kwargs or {}),
    )


class _Assembler:
    """Collects a stream into a Completion."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.logprobs: list[common_pb2.TokenLogprobs] = []
        self.completion: Completion | None = None

    def add(self, response: gateway_pb2.GenerateResponse) -> None:
        if response.HasField("delta"):
            self.text.append(response.delta.text)
            self.logprobs += response.delta.logprobs
            return
        done = response.finished
        self.completion = Completion(
            text="".join(self.text),
            token_ids=list(done.token_ids),
            prompt_token_ids=list(done.prompt_token_ids),
            finish_reason=finish_reason_name(done.finish_reason),
            usage={
                "prompt_tokens": done.usage.prompt_tokens,
                "completion_tokens": done.usage.completion_tokens,
                "cached_prompt_tokens": done.usage.cached_prompt_tokens,
            },
            stats=done.stats,
            logprobs=self.logprobs,
        )

    def result(self) -> Completion:
        if self.completion is None:
            raise RuntimeError("the gateway closed the stream without a final message")
        return self.completion


def _backoff(attempt: int) -> float:
    return min(0.2 * 2**attempt, 2.0)


def _metadata(request: gateway_pb2.GenerateRequest, api_key: str) -> list[tuple[str, str]]:
    """The request id (if any) and the API key (if any), as the gateway reads them."""
    metadata = [(REQUEST_ID_KEY, request.request_id)] if request.request_id else []
    return metadata + ([("authorization", f"Bearer {api_key}")] if api_key else [])


class Client:
    def __init__(
        self,
        address: str,
        timeout_seconds: float | None = 300.0,
        max_retries: int = 2,
        tls: TlsFiles | None = None,
        api_key: str = "",
    ):
        self._channel = sync_channel(address, tls, GRPC_OPTIONS)
        self._stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.api_key = api_key
        self.num_retries = 0  # calls sent again after a retryable failure, since made

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def stream(self, messages: Sequence[Message], *args, **kwargs) -> Iterator:
        """GenerateResponse messages: text deltas, then the final one (see `deltas`)."""
        request = build_request(messages, *args, **kwargs)
        for attempt in range(self.max_retries + 1):
            received = False
            try:
                for response in self._stub.Generate(
                    request, timeout=self.timeout_seconds, metadata=_metadata(request, self.api_key)
                ):
                    received = True
                    yield response
                return
            except grpc.RpcError as error:
                if received or error.code() not in RETRYABLE or attempt == self.max_retries:
                    raise client_error(error) from error
            self.num_retries += 1
            time.sleep(_backoff(attempt))

    def deltas(self, messages: Sequence[Message], *args, **kwargs) -> Iterator[Delta]:
        """Typed pieces of the stream; the last has finish_reason and usage."""
        for response in self.stream(messages, *args, **kwargs):
            yield delta_from_response(response)

    def complete(self, messages: Sequence[Message], *args, **kwargs) -> Completion:
        assembler = _Assembler()
        for response in self.stream(messages, *args, **kwargs):
            assembler.add(response)
        return assembler.result()


class AsyncClient:
    def __init__(
        self,
        address: str,
        timeout_seconds: float | None = 300.0,
        max_retries: int = 2,
        tls: TlsFiles | None = None,
        api_key: str = "",
    ):
        self._channel = aio_channel(address, tls, GRPC_OPTIONS)
        self._stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.api_key = api_key

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def stream(self, messages: Sequence[Message], *args, **kwargs) -> AsyncIterator:
        request = build_request(messages, *args, **kwargs)
        for attempt in range(self.max_retries + 1):
            received = False
            call = self._stub.Generate(
                request, timeout=self.timeout_seconds, metadata=_metadata(request, self.api_key)
            )
            try:
                async for response in call:
                    received = True
                    yield response
                return
            except grpc.aio.AioRpcError as error:
                if received or error.code() not in RETRYABLE or attempt == self.max_retries:
                    raise client_error(error) from error
            finally:
                call.cancel()
            await asyncio.sleep(_backoff(attempt))

    async def deltas(self, messages: Sequence[Message], *args, **kwargs) -> AsyncIterator[Delta]:
        """Typed pieces of the stream; the last has finish_reason and usage."""
        async for response in self.stream(messages, *args, **kwargs):
            yield delta_from_response(response)

    async def complete(self, messages: Sequence[Message], *args, **kwargs) -> Completion:
        assembler = _Assembler()
        async for response in self.stream(messages, *args, **kwargs):
            assembler.add(response)
        return assembler.result()
