"""Who may call which method, by the caller's certificate (mutual TLS only).

Convention: a caller's name is the common name (CN) of its client certificate, and the
name is its role: `gateway`, `decoder`, `encoder`, `client` (what `tessera serve --tls
auto` issues; tessera.certs). Each service allows, per method, a set of caller names;
`--allow-callers METHOD=NAME[,NAME...]` replaces one method's set, and `*` means any
caller with a certificate from the CA.

    --allow-callers Encode=gateway,decoder --allow-callers GetStats='*'

Health checks are open to every caller that completed the TLS handshake; reflection
(when enabled) to any authenticated caller. A method with no rule is refused. Without a
CA there is no verified identity and so no check at all (plaintext dev mode, logged as a
warning at start).
"""

from __future__ import annotations

import argparse
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger("tessera.access")

ANY_CALLER = "*"
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_REFLECTION_PREFIXES = (
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
_OPEN = None  # no check


@dataclass(frozen=True)
class AccessRules:
    """The caller names each method of `service` (e.g. "tessera.v1.EncoderService")
    allows, keyed by the method's short name."""

    service: str
    allowed: Mapping[str, frozenset[str]]

    def callers_for(self, full_method: str) -> frozenset[str] | None:
        """The names allowed to call `/package.Service/Method`; None: open to all."""
        if full_method.startswith(_HEALTH_PREFIX):
            return _OPEN
        if full_method.startswith(_REFLECTION_PREFIXES):
            return frozenset({ANY_CALLER})
        service, _, method = full_method.lstrip("/").partition("/")
        if service != self.service:
            return frozenset()
        return self.allowed.get(method, frozenset())

    def with_overrides(self, overrides: Mapping[str, frozenset[str]]) -> AccessRules:
        unknown = set(overrides) - set(self.allowed)
        if unknown:
            raise ValueError(
                f"--allow-callers: {self.service} has no method {', '.join(sorted(unknown))} "
                f"(it has {', '.join(self.allowed)})"
            )
        return AccessRules(self.service, {**self.allowed, **overrides})

    def describe(self) -> str:
        """`Encode=decoder,gateway GetStats=*`, for the start line."""
        return " ".join(f"{m}={','.join(sorted(names))}" for m, names in self.allowed.items())


def caller_rule(value: str) -> tuple[str, frozenset[str]]:
    """`"Encode=gateway, decoder"` -> `("Encode", frozenset({"gateway", "decoder"}))`."""
    method, sep, names = value.partition("=")
    callers = frozenset(n.strip() for n in names.split(",") if n.strip())
    if not sep or not method.strip() or not callers:
        raise argparse.ArgumentTypeError(f"expected METHOD=NAME[,NAME...], got {value!r}")
    return method.strip(), callers


def add_allow_callers_flag(parser: argparse.ArgumentParser, defaults: AccessRules) -> None:
    parser.add_argument(
        "--allow-callers",
        type=caller_rule,
        action="append",
        default=[],
        metavar="METHOD=NAME[,NAME...]",
        help="with mutual TLS, the client-certificate common names that may call METHOD "
        f"('*': any; repeatable; defaults: {defaults.describe()})",
    )


def rules_from_args(args: argparse.Namespace, defaults: AccessRules) -> AccessRules:
    try:
        return defaults.with_overrides(dict(args.allow_callers))
    except ValueError as error:
        raise SystemExit(str(error)) from None


def caller_name(context: grpc.aio.ServicerContext) -> str:
    """The common name of the caller's verified certificate ("" if none)."""
    names = context.auth_context().get("x509_common_name", [])
    return names[0].decode(errors="replace") if names else ""


Check = Callable[[grpc.aio.ServicerContext], Awaitable[None]]


class CallerCheck(grpc.aio.ServerInterceptor):
    """Refuses, with PERMISSION_DENIED, a call whose caller's name the rules do not allow
    for the method. The caller's certificate is only known to the call's context, so the
    check runs inside the handler: each handler is wrapped, streaming ones included."""

    def __init__(self, rules: AccessRules):
        self.rules = rules

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        allowed = self.rules.callers_for(details.method)
        if handler is None or allowed is _OPEN:
            return handler
        return guarded(handler, _checker(details.method, allowed))


def _checker(method: str, allowed: frozenset[str]) -> Check:
    async def check(context: grpc.aio.ServicerContext) -> None:
        caller = caller_name(context)
        if ANY_CALLER in allowed or caller in allowed:
            return
        message = f"{method.lstrip('/')}: caller {caller!r} is not allowed (--allow-callers)"
        log.warning("refused %s", message)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)

    return check


def guarded(handler: grpc.RpcMethodHandler, check: Check) -> grpc.RpcMethodHandler:
    """`handler` with `check(context)` awaited before its behavior runs."""
    if handler.request_streaming and handler.response_streaming:
        field = "stream_stream"
    elif handler.request_streaming:
        field = "stream_unary"
    elif handler.response_streaming:
        field = "unary_stream"
    else:
        field = "unary_unary"
    behavior = getattr(handler, field)
    return handler._replace(**{field: _wrap(behavior, check)})


def _wrap(behavior: Callable[..., Any], check: Check) -> Callable[..., Any]:
    # Keep the kind: grpc.aio streams an async generator's items, and awaits a coroutine
    # (one that writes with context.write).
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            async for response in behavior(request, context):
                yield response

        return stream

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(context)
        return await behavior(request, context)

    return call
