"""One line per request at the gateway (logger `tessera.gateway.access`): who, how it
ended, and what it cost. With `--log-format json` every field is a key of the line."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import grpc

log = logging.getLogger("tessera.gateway.access")

# The HTTP status the HTTP API answers each gRPC code with; any other code is a 500.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# A client that went away got no answer; logged as nginx does, 499.
_CLIENT_GONE = 499


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS.get(code, 500)


def status_text(protocol: str, code: grpc.StatusCode) -> str:
    """What the client saw: the HTTP status over HTTP, the gRPC code's name over gRPC."""
    if protocol != "http":
        return code.name
    return str(_CLIENT_GONE if code == grpc.StatusCode.CANCELLED else http_status(code))


@dataclass
class AccessRecord:
    request_id: str
    protocol: str  # "http" or "grpc"
    model: str
    status: str = "OK"
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0
    media_items: int = 0
    # Of the request's unique items, those an encoder served from a cache (memory or Redis).
    media_items_cached: int = 0
    ttft_seconds: float | None = None
    total_seconds: float = 0.0
    finish_reason: str = ""


def log_access(record: AccessRecord) -> None:
    fields = dataclasses.asdict(record)
    for key in ("ttft_seconds", "total_seconds"):
        if fields[key] is not None:
            fields[key] = round(fields[key], 4)
    log.info("request", extra={"fields": fields})
