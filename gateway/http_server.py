"""The gateway's OpenAI-compatible HTTP API (Starlette on uvicorn), in the gRPC server's
event loop.

    POST /v1/chat/completions   POST /v1/completions   POST /tokenize   POST /detokenize
    GET /v1/models   GET /version   GET /health   GET /ready   GET /metrics
    GET /openapi.json (the OpenAPI 3.1 document of all of these, gateway/openapi/)

Errors are `{"error": {"message", "type", "param", "code"}}` (404 and 405 too) with 400
for bad input, 415 for a body that is not JSON, 413 for a body over --max-request-bytes,
429 (with Retry-After) when too many requests are queued, 503/504 when backends fail or
time out. Generation itself (choices, streaming) is gateway/http_generation.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import uvicorn
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway import completions_api, http_generation, openai_api, openapi, tokens_api
from gateway.access_log import http_status
from gateway.api_keys import ApiKeys, UnauthenticatedError
from gateway.choices import choice_requests
from gateway.front import ChatRequest, GatewayFront, Rejected
from gateway.generation_defaults import NEUTRAL, SamplingDefaults
from gateway.http_generation import REQUEST_ID_HEADER
from gateway.logprobs import DEFAULT_MAX_LOGPROBS
from gateway.media_fetch import MediaFetchPolicy
from gateway.pipeline import DownstreamError, GenerationPipeline
from gateway.prompt import PromptError
from gateway.responses import ChatShape
from gateway.tools import DEFAULT_TOOL_SETTINGS, ToolSettings
from tessera import __version__
from tessera.limits import check_request_id

log = logging.getLogger("tessera.gateway.http")

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
        max_logprobs: int = DEFAULT_MAX_LOGPROBS,
    ):
        self.front, self.registry, self.policy = front, registry, policy
        self.max_request_bytes = max_request_bytes
        self.request_timeout_seconds = request_timeout_seconds
        self.backends = backends  # ReplicaSets whose every address /ready checks
        self.api_keys = api_keys
        self.sampling_defaults = sampling_defaults  # from the checkpoint's generation_config
        self.tool_settings = tool_settings  # --tool-call-parser, --enable-auto-tool-choice
        self.max_logprobs = max_logprobs
        self.tokens = tokens_api.TokensApi(front, policy)
        routes = [
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
            Route(openapi.OPENAPI_PATH, self.openapi, methods=["GET"]),
        ]
        if metrics_route:  # else /metrics is on --metrics-port only, off the public port
            routes.append(Route("/metrics", self.metrics, methods=["GET"]))
        # 404 and 405 in the error format of every other answer, not Starlette's text.
        handlers = {HTTPException: _starlette_error}
        self.app = Starlette(routes=routes, exception_handlers=handlers)

    def _tenant(self, request: Request) -> str:
        """The caller's tenant from its API key; raises a 401 HttpError without a valid
        key (when keys are configured)."""
        try:
            return self.api_keys.tenant_for(request.headers.get("authorization"))
        except UnauthenticatedError as error:
            raise HttpError(
                401, "invalid_request_error", str(error), code="invalid_api_key"
            ) from None

    def _request_id(self, request: Request) -> str:
        """The client's X-Request-Id, checked; raises a 400 HttpError (never echoing it)."""
        request_id = request.headers.get(REQUEST_ID_HEADER) or GenerationPipeline.new_request_id()
        try:
            check_request_id(request_id, REQUEST_ID_HEADER)
        except ValueError as error:
            raise HttpError(400, "invalid_request_error", str(error), REQUEST_ID_HEADER) from None
        return request_id

    async def _generation(self, request: Request, parse: GenerationParser) -> Response:
        """Authentication, the body, then the generations `parse` makes of it."""
        request_id = GenerationPipeline.new_request_id()
        try:
            tenant = self._tenant(request)  # before anything else is looked at
            request_id = self._request_id(request)
            body = await self._read_json(request)
            plan = await parse(body, request_id)
            self.front.check_model(plan.requests[0].model)
        except HttpError as error:
            return self._refused(error, request_id)
        except (Rejected, PromptError, DownstreamError) as error:
            return self._refused(http_error(error), request_id)
        requests = [dataclasses.replace(r, tenant=tenant, protocol="http") for r in plan.requests]
        # From here on, the front counts and logs each choice however it ends.
        try:
            if plan.stream:
                return await http_generation.stream(
                    self.front, requests, plan.shape, plan.include_usage, _error_body
                )
            return await http_generation.complete(request, self.front, requests, plan.shape)
        except (Rejected, PromptError, DownstreamError) as error:
            return http_error(error).response(request_id)

    def _refused(self, error: HttpError, request_id: str) -> Response:
        """A request refused before generation: counted and logged, then answered."""
        self.front.refused(request_id, "http", str(error.status))
        return error.response(request_id)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generation(request, self._chat_plan)

    async def completions(self, request: Request) -> Response:
        return await self._generation(request, self._completions_plan)

    async def _chat_plan(self, body: object, request_id: str) -> GenerationPlan:
        settings = openai_api.ChatSettings(
            self.policy,
            self.request_timeout_seconds,
            self.max_logprobs,
            self.sampling_defaults,
            self.tool_settings,
        )
        parsed = await openai_api.chat_body(body, request_id, settings)
        shape = ChatShape(
            request_id,
            parsed.chat.model or self.front.model_name,
            parsed.logprobs,
            self._token_text,
            parsed.chat.tools,
        )
        requests = choice_requests(parsed.chat, parsed.n)
        return GenerationPlan(requests, shape, parsed.stream, parsed.include_usage)

    async def _completions_plan(self, body: object, request_id: str) -> GenerationPlan:
        parsed = completions_api.completions_body(
            body,
            request_id,
            self.request_timeout_seconds,
            self.max_logprobs,
            self._tokenize,
            self.sampling_defaults,
        )
        shape = completions_api.CompletionShape(
            request_id,
            parsed.chat.model or self.front.model_name,
            parsed.logprobs,
            self._token_text,
            self.front.pipeline.builder.family.decode_tokens,
            parsed.echo,
            parsed.chat.prompt_token_ids or (),
        )
        requests = choice_requests(parsed.chat, parsed.n)
        return GenerationPlan(requests, shape, parsed.stream, parsed.include_usage)

    def _token_text(self, token_id: int) -> str:
        return self.front.pipeline.builder.family.decode_tokens([token_id])

    def _tokenize(self, text: str) -> list[int]:
        return self.front.pipeline.builder.family.tokenize(text)

    async def _read_json(self, request: Request):
        media_type = request.headers.get("content-type", "application/json")
        if media_type.split(";")[0].strip().lower() != "application/json":
            raise HttpError(
                415,
                "invalid_request_error",
                f"Content-Type {media_type!r} is not supported; send application/json",
                "Content-Type",
            )
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise self._too_large()
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > self.max_request_bytes:
                raise self._too_large()
        if not body:
            raise HttpError(400, "invalid_request_error", "the body is empty; send a JSON object")
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

    async def tokenize(self, request: Request) -> Response:
        return await self._tokens(request, self.tokens.tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._tokens(request, self.tokens.detokenize)

    async def _tokens(self, request: Request, handle: Callable[[object], Awaitable[dict]]):
        request_id = GenerationPipeline.new_request_id()
        try:
            self._tenant(request)
            body = await self._read_json(request)
            return JSONResponse(await handle(body), headers={REQUEST_ID_HEADER: request_id})
        except HttpError as error:
            return error.response(request_id)
        except (Rejected, PromptError) as error:
            return http_error(error).response(request_id)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": __version__})

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


async def _starlette_error(request: Request, error: HTTPException) -> Response:
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    message = f"{request.method} {request.url.path}: {error.detail}"
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


def _error_body(error: Exception) -> dict:
    return http_error(error).response_body()


@dataclass(frozen=True)
class GenerationPlan:
    """What a generating endpoint makes of a body: the request of each choice, how to
    shape the answer, and whether to stream it."""

    requests: list[ChatRequest]
    shape: http_generation.Shape
    stream: bool
    include_usage: bool


GenerationParser = Callable[[object, str], Awaitable[GenerationPlan]]


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
