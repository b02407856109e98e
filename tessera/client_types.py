"""The Python client's typed values: sampling parameters, stream deltas and errors.

`SamplingParams` mirrors the proto's `tessera.v1.SamplingParams` field for field (a test
checks they cover the same names) and converts to protobuf in one place, `to_proto`.
This module imports grpc and the generated messages only: no torch, no transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import grpc

from tessera.v1 import common_pb2


@dataclass(frozen=True)
class StructuredOutput:
    """A grammar the output must follow; at most one field is set (none: unconstrained)."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    lark: str | None = None

    def __post_init__(self) -> None:
        chosen = [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]
        if len(chosen) > 1:
            raise ValueError(f"structured_output: set one of {', '.join(chosen)}, not several")

    def to_proto(self) -> common_pb2.StructuredOutput:
        import json

        if self.json_schema is not None:
            return common_pb2.StructuredOutput(json_schema=json.dumps(self.json_schema))
        if self.json_object:
            return common_pb2.StructuredOutput(json_object=True)
        if self.regex is not None:
            return common_pb2.StructuredOutput(regex=self.regex)
        if self.lark is not None:
            return common_pb2.StructuredOutput(lark=self.lark)
        return common_pb2.StructuredOutput()


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each token; the defaults are the proto's (greedy, server max_tokens).

    Field meanings and bounds are those of proto/tessera/v1/common.proto.
    """

    max_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    num_top_logprobs: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 0.0
    min_p: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    structured_output: StructuredOutput | None = None

    def to_proto(self) -> common_pb2.SamplingParams:
        """The one conversion: every field by name, so a new field cannot be forgotten
        silently (the proto constructor refuses a name it does not have)."""
        values: dict[str, Any] = {}
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue  # unset optional (seed) or no grammar
            if isinstance(value, StructuredOutput):
                value = value.to_proto()
            elif isinstance(value, tuple):
                value = list(value)
            values[item.name] = value
        return common_pb2.SamplingParams(**values)


def sampling_proto(
    sampling: SamplingParams | common_pb2.SamplingParams | None,
) -> common_pb2.SamplingParams:
    """Typed or protobuf parameters (the latter kept for older callers) as protobuf."""
    if sampling is None:
        return common_pb2.SamplingParams()
    if isinstance(sampling, SamplingParams):
        return sampling.to_proto()
    return sampling


@dataclass(frozen=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives."""

    token_id: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int


@dataclass(frozen=True)
class Delta:
    """One piece of a stream: new text and its tokens; the last one has `finish_reason`
    ("stop" or "length") and `usage`, and no text."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None


def finish_reason_name(value: int) -> str:
    return common_pb2.FinishReason.Name(value).removeprefix("FINISH_REASON_").lower()


def token_logprobs(messages) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(m.token_id, m.logprob, tuple(TopLogprob(t.token_id, t.logprob) for t in m.top))
        for m in messages
    )


def delta_from_response(response) -> Delta:
    """A gateway_pb2.GenerateResponse as a Delta."""
    if response.HasField("delta"):
        part = response.delta
        return Delta(part.text, tuple(part.token_ids), token_logprobs(part.logprobs))
    done = response.finished
    usage = Usage(
        done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.cached_prompt_tokens
    )
    return Delta(finish_reason=finish_reason_name(done.finish_reason), usage=usage)


class TesseraError(grpc.RpcError):
    """A call the gateway failed or refused. Still a grpc.RpcError with `code()` and
    `details()`, so code written against the raw gRPC errors keeps working."""

    def __init__(self, status: grpc.StatusCode, message: str):
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message

    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return self.message


class InvalidRequest(TesseraError):
    """Bad input (INVALID_ARGUMENT, OUT_OF_RANGE): the message says what to fix."""


class Unauthenticated(TesseraError):
    """No or a wrong API key (UNAUTHENTICATED)."""


class PermissionDenied(TesseraError):
    """The client certificate's role may not call this method (PERMISSION_DENIED)."""


class Unavailable(TesseraError):
    """No gateway there, it is restarting, or no replica can serve (UNAVAILABLE,
    FAILED_PRECONDITION)."""


class Overloaded(TesseraError):
    """Too many requests waiting (RESOURCE_EXHAUSTED); retry later."""


class DeadlineExceeded(TesseraError):
    """The call's `timeout_seconds` passed (DEADLINE_EXCEEDED)."""


class NotFound(TesseraError):
    """An unknown model name (NOT_FOUND)."""


class Cancelled(TesseraError):
    """The call was cancelled (CANCELLED)."""


class ServerError(TesseraError):
    """A fault on the server's side (INTERNAL, UNKNOWN, ...)."""


ERROR_CLASSES: dict[grpc.StatusCode, type[TesseraError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequest,
    grpc.StatusCode.OUT_OF_RANGE: InvalidRequest,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.CANCELLED: Cancelled,
}


def client_error(error: grpc.RpcError) -> TesseraError:
    """The client's own exception for a gRPC error (ServerError for any other code)."""
    if isinstance(error, TesseraError):
        return error
    status = error.code() if callable(getattr(error, "code", None)) else None
    status = status or grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    return ERROR_CLASSES.get(status, ServerError)(status, details or "")
