"""A small client for the gateway's gRPC API (used by `tessera generate` and the tests)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import grpc

from tessera.server import GRPC_OPTIONS
from tessera.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


@dataclass(frozen=True)
class Message:
    """A chat message: `parts` are strings (text) or bytes (an encoded image)."""

    role: str
    parts: Sequence[str | bytes]

    def to_proto(self) -> gateway_pb2.ChatMessage:
        return gateway_pb2.ChatMessage(
            role=self.role,
            content=[
                gateway_pb2.ContentPart(text=p)
                if isinstance(p, str)
                else gateway_pb2.ContentPart(image=p)
                for p in self.parts
            ],
        )


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    usage: dict[str, int]
    stats: gateway_pb2.RequestStats
    logprobs: list[common_pb2.TokenLogprobs] = field(default_factory=list)


class Client:
    """Synchronous client: `Client("127.0.0.1:50051").complete([Message("user", ["hi"])])`."""

    def __init__(self, address: str, timeout_seconds: float | None = 300.0):
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)
        self.timeout_seconds = timeout_seconds

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def stream(
        self,
        messages: Sequence[Message],
        sampling: common_pb2.SamplingParams | None = None,
        max_chunk_tokens: int = 0,
        request_id: str = "",
        cache_salt: str = "",
    ) -> Iterator[gateway_pb2.GenerateResponse]:
        request = gateway_pb2.GenerateRequest(
            request_id=request_id,
            messages=[m.to_proto() for m in messages],
            sampling=sampling or common_pb2.SamplingParams(),
            max_chunk_tokens=max_chunk_tokens,
            cache_salt=cache_salt,
        )
        yield from self._stub.Generate(request, timeout=self.timeout_seconds)

    def complete(
        self,
        messages: Sequence[Message],
        sampling: common_pb2.SamplingParams | None = None,
        max_chunk_tokens: int = 0,
        request_id: str = "",
        cache_salt: str = "",
    ) -> Completion:
        text: list[str] = []
        logprobs: list[common_pb2.TokenLogprobs] = []
        for response in self.stream(messages, sampling, max_chunk_tokens, request_id, cache_salt):
            if response.HasField("delta"):
                text.append(response.delta.text)
                logprobs += response.delta.logprobs
            else:
                done = response.finished
                return Completion(
                    text="".join(text),
                    token_ids=list(done.token_ids),
                    prompt_token_ids=list(done.prompt_token_ids),
                    finish_reason=common_pb2.FinishReason.Name(done.finish_reason)
                    .removeprefix("FINISH_REASON_")
                    .lower(),
                    usage={
                        "prompt_tokens": done.usage.prompt_tokens,
                        "completion_tokens": done.usage.completion_tokens,
                    },
                    stats=done.stats,
                    logprobs=logprobs,
                )
        raise RuntimeError("the gateway closed the stream without a final message")
