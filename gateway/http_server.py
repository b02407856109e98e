"""The gateway's OpenAI-compatible HTTP API (Starlette on uvicorn), in the gRPC server's
event loop.

    POST /v1/chat/completions   GET /v1/models   GET /health   GET /ready   GET /metrics
    GET /openapi.json (the OpenAPI 3.1 document of all of these, gateway/openapi.py)

Errors are `{"error": {"message", "type", "param", "code"}}` with 400 for bad input, 413
for a body over --max-request-bytes, 429 (with Retry-After) when too many requests are
queued, 503/504 when backends fail or time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import AsyncIterator

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway import openai_api, openapi
from gateway.access_log import http_status
from gateway.api_keys import ApiKeys, UnauthenticatedError
from gateway.front import GatewayFront, Outcome, Rejected
from gateway.generation_defaults import NEUTRAL, SamplingDefaults
from gateway.media_fetch import MediaFetchPolicy
from gateway.pipeline import DownstreamError, GenerationPipeline
from gateway.prompt import PromptError
from gateway.tool_calls import output_stream
from gateway.tools import DEFAULT_TOOL_SETTINGS, ToolSettings
from tessera.limits import check_request_id

log = logging.getLogger("tessera.gateway.http")

REQUEST_ID_HEADER = "X-Request-Id"
# OpenAI's error type for each HTTP status (gateway.access_log maps gRPC codes to these).
_KIND = {
    400: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    503: "service_unavailable",
    404: "not_found_error",
}


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        param: str | None = None,
        code: str | None = None,
        **headers,
    ):
        super().__init__(message)
        self.status, self.kind, self.param, self.headers = status, kind, param, headers
        self.code = code

    def response_body(self) -> dict:
        return {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}

    def response(self, request_id: str) -> JSONResponse:
        body = {"error": self.response_body()}
        headers = {REQUEST_ID_HEADER: request_id, **self.headers}
        return JSONResponse(body, status_code=self.status, headers=headers)


def http_error(error: Exception) -> HttpError:
    status = http_status(getattr(error, "code", grpc.StatusCode.INVALID_ARGUMENT))
    kind = _KIND.get(status, "server_error")
    headers = {}
    if isinstance(error, Rejected) and error.retry_after_seconds:
        headers["Retry-After"] = str(error.retry_after_seconds)
    return HttpError(status, kind, str(error), getattr(error, "param", None), **headers)


class HttpApi:
    def __init__(
        self,
        front: GatewayFront,
        registry: CollectorRegistry,
        policy: MediaFetchPolicy,
        max_request_bytes: int,
        request_timeout_seconds: float,
        backends: list,
        api_keys: ApiKeys,
        metrics_route: bool,
        sampling_defaults: SamplingDefaults = NEUTRAL,
        tool_settings: ToolSettings = DEFAULT_TOOL_SETTINGS,
    ):
        self.front, self.registry, self.policy = front, registry, policy
        self.max_request_bytes = max_request_bytes
        self.request_timeout_seconds = request_timeout_seconds
        self.backends = backends  # ReplicaSets whose every address /ready checks
        self.api_keys = api_keys
        self.sampling_defaults = sampling_defaults  # from the checkpoint's generation_config
        self.tool_settings = tool_settings  # --tool-call-parser, --enable-auto-tool-choice
        routes = [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
            Route(openapi.OPENAPI_PATH, self.openapi, methods=["GET"]),
        ]
        if metrics_route:  # else /metrics is on --metrics-port only, off the public port
            routes.append(Route("/metrics", self.metrics, methods=["GET"]))
        self.app = Starlette(routes=routes)

    def _tenant(self, request: Request) -> str:
        """The caller's tenant from its API key; raises a 401 HttpError without a valid
        key (when keys are configured)."""
        try:
            return self.api_keys.tenant_for(request.headers.get("authorization"))
        except UnauthenticatedError as error:
            raise HttpError(
                401, "invalid_request_error", str(error), code="invalid_api_key"
            ) from None

    async def chat_completions(self, request: Request) -> Response:
        try:
            tenant = self._tenant(request)  # before anything else is looked at
        except HttpError as error:
            return self._refused(error, GenerationPipeline.new_request_id())
        request_id = request.headers.get(REQUEST_ID_HEADER) or GenerationPipeline.new_request_id()
        try:
            check_request_id(request_id, REQUEST_ID_HEADER)
        except ValueError as error:
            # Never echoed back: the response carries an id of our own.
            refused = HttpError(400, "invalid_request_error", str(error), REQUEST_ID_HEADER)
            return self._refused(refused, GenerationPipeline.new_request_id())
        try:
            body = await self._read_json(request)
            chat = await openai_api.chat_request_from_body(
                body,
                request_id,
                self.policy,
                self.request_timeout_seconds,
                self.sampling_defaults,
                self.tool_settings,
            )
            chat = dataclasses.replace(chat, tenant=tenant, protocol="http")
            stream, include_usage = openai_api.stream_settings(body)
        except HttpError as error:
            return self._refused(error, request_id)
        except (Rejected, PromptError, DownstreamError) as error:
            return self._refused(http_error(error), request_id)
        # From here on, the front counts and logs the request however it ends.
        model = chat.model or self.front.model_name
        try:
            if stream:
                events = self._stream(chat, model, include_usage)
                first = await anext(events)  # errors before the first token are plain HTTP errors
                return StreamingResponse(
                    _prepend(first, events),
                    media_type="text/event-stream",
                    headers={REQUEST_ID_HEADER: request_id},
                )
            return await self._complete(request, chat, model)
        except (Rejected, PromptError, DownstreamError) as error:
            return http_error(error).response(request_id)

    def _refused(self, error: HttpError, request_id: str) -> Response:
        """A request refused before generation: counted and logged, then answered."""
        self.front.refused(request_id, "http", str(error.status))
        return error.response(request_id)

    async def _complete(self, request: Request, chat, model: str) -> Response:
        outcome = Outcome()

        async def run() -> str:
            return "".join([text async for text, _ in self.front.generate(chat, outcome)])

        task = asyncio.create_task(run())
        # A client that hangs up stops its generation (and frees its KV blocks) at once.
        while not task.done():
            await asyncio.wait([task], timeout=0.1)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return Response(status_code=499)
        text = task.result()
        return JSONResponse(
            openai_api.completion(chat.request_id, model, text, outcome, chat.tools),
            headers={REQUEST_ID_HEADER: chat.request_id},
        )

    async def _stream(self, chat, model: str, include_usage: bool) -> AsyncIterator[str]:
        outcome = Outcome()
        events = self.front.generate(chat, outcome)
        tools = chat.tools
        # Content deltas, or with tools, content until a call opens and then the calls.
        output = output_stream(bool(tools and tools.parses_calls), not tools or tools.parallel)
        first = True
        try:
            async for text, _ in events:
                for delta in output.feed(text):
                    delta = {"role": "assistant", **delta} if first else delta
                    first = False
                    yield _sse(openai_api.chunk(chat.request_id, model, delta, None))
            for delta in output.finish():
                delta = {"role": "assistant", **delta} if first else delta
                first = False
                yield _sse(openai_api.chunk(chat.request_id, model, delta, None))
        except (Rejected, PromptError, DownstreamError) as error:
            if first:
                raise
            # After the first token an error can only be an event: never a silent cut.
            yield _sse({"error": http_error(error).response_body()})
            yield "data: [DONE]\n\n"
            return
        if first:
            yield _sse(openai_api.chunk(chat.request_id, model, {"role": "assistant"}, None))
        finish_reason = "tool_calls" if output.num_calls else outcome.finish_reason
        yield _sse(openai_api.chunk(chat.request_id, model, {}, finish_reason))
        if include_usage:
            yield _sse(openai_api.usage_chunk(chat.request_id, model, outcome))
        yield "data: [DONE]\n\n"

    async def _read_json(self, request: Request):
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise self._too_large()
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > self.max_request_bytes:
                raise self._too_large()
        try:
            return json.loads(body)
        except ValueError as error:
            raise HttpError(
                400, "invalid_request_error", f"the body is not JSON: {error}"
            ) from None
        except RecursionError:  # 100k nested brackets: a 400, not a crashed handler
            raise HttpError(400, "invalid_request_error", "the body nests too deeply") from None

    def _too_large(self) -> HttpError:
        return HttpError(
            413,
            "invalid_request_error",
            f"the request body is larger than {self.max_request_bytes} bytes "
            "(--max-request-bytes); send smaller or fewer media items",
        )

    async def models(self, request: Request) -> Response:
        try:
            self._tenant(request)
        except HttpError as error:
            return error.response(GenerationPipeline.new_request_id())
        # vLLM's shape, plus the inputs the model takes beside text, so a client can
        # tell an audio model from an image model before sending either.
        modalities = sorted(m.value for m in self.front.pipeline.builder.family.modalities)
        data = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "tessera",
                "input_modalities": ["text", *modalities],
            }
            for name in self.front.model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        checks = {
            address: await _serving(replicas.channels.get(address))
            for replicas in self.backends
            for address in replicas.addresses
        }
        status = 200 if checks and all(checks.values()) else 503
        return JSONResponse({"ready": status == 200, "backends": checks}, status_code=status)

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    async def openapi(self, request: Request) -> Response:
        return Response(openapi.DOCUMENT_JSON, media_type="application/json")


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _prepend(first: str, rest: AsyncIterator[str]) -> AsyncIterator[str]:
    yield first
    async for item in rest:
        yield item


async def _serving(channel: grpc.aio.Channel) -> bool:
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=2
        )
    except grpc.aio.AioRpcError:
        return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


class EmbeddedServer(uvicorn.Server):
    """uvicorn inside a loop that already handles SIGTERM (the gRPC server's)."""

    task: asyncio.Task | None = None

    def capture_signals(self):
        return contextlib.nullcontext()


async def start_http(app: Starlette, host: str, port: int) -> EmbeddedServer:
    server = EmbeddedServer(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    )
    server.task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    return server
