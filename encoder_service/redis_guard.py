"""Runs each Redis operation so that Redis can never fail or stall a call (invariant 5):
under a circuit breaker, a per-call deadline and a bound on concurrent commands, turning
every failure into the caller's default (a miss) and counting it.

After a connection or timeout error Redis is *degraded*: for a backoff period calls
return their default without touching Redis, so a dead Redis costs one timeout per
period, not one per call, and no reconnect storm; then one call probes.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.exceptions

from encoder_service.breaker import CircuitBreaker

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that mean "Redis is unreachable, too slow or refuses us": they trip the breaker.
# A wrong password or client certificate lands here too (AuthenticationError is a
# ConnectionError; a refused TLS handshake an OSError): the encoder serves without Redis
# and keeps probing, so fixing the Secret brings the cache back without a restart.
_DOWN_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    asyncio.TimeoutError,  # our per-call deadline (the builtin TimeoutError on 3.11+)
    OSError,
    redis.exceptions.ClusterError,  # includes CLUSTERDOWN
    redis.exceptions.RedisClusterException,  # e.g. no node reachable to learn the slots
)


@dataclass
class RedisStoreStats:
    num_hits: int = 0
    num_misses: int = 0
    num_corrupt: int = 0
    num_errors: int = 0
    num_writes: int = 0
    num_bytes_read: int = 0
    degraded: bool = False


class RedisGuard:
    """Admits, bounds and judges Redis operations; keeps `stats.degraded` and
    `stats.num_errors` up to date."""

    def __init__(
        self,
        stats: RedisStoreStats,
        timeout_seconds: float,
        max_connections: int,
        backoff_start_seconds: float,
        backoff_max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self.timeout_seconds = timeout_seconds
        self._breaker = CircuitBreaker(backoff_start_seconds, backoff_max_seconds, clock)
        # Bounds concurrent commands to the pool size: redis-py's pools raise (not wait)
        # when exhausted, which would look like Redis being down.
        self._slots = asyncio.Semaphore(max_connections)

    async def run(self, operation: Awaitable[T], default: T) -> T:
        """`await operation`, or `default` if Redis is degraded, fails or is too slow."""
        probe = self._breaker.admit()
        if probe is None:
            _close(operation)
            return default
        verdict_given = False
        try:
            # Waiting for a free slot is outside the deadline: a busy pool is load, not
            # Redis failing, and must not trip the breaker. Each holder is bounded by it.
            async with self._slots:
                result = await asyncio.wait_for(operation, self.timeout_seconds)
            self._on_up()
            verdict_given = True
            return result
        except _DOWN_ERRORS as error:
            self._on_down(error, probe)
            verdict_given = True
            return default
        except redis.exceptions.RedisError as error:
            # A command error (OOM on SET, a non-string at our key, an ACL refusal of one
            # command): Redis answered, so count it but keep the store up for the rest.
            self.stats.num_errors += 1
            log.warning("redis command failed: %s", error)
            self._on_up()
            verdict_given = True
            return default
        finally:
            if not verdict_given:
                self._breaker.abandoned(probe)
                _close(operation)

    def _on_up(self) -> None:
        if self._breaker.down:
            log.warning("redis reachable again")
        self._breaker.succeeded()
        self.stats.degraded = False

    def _on_down(self, error: BaseException, probe: bool) -> None:
        self.stats.num_errors += 1
        if self._breaker.failed(probe):
            log.warning(
                "redis unavailable (%s: %s)%s; serving misses while it is down",
                type(error).__name__,
                error,
                _hint(error),
            )
        self.stats.degraded = True


# Words of the errors Redis and OpenSSL give when they refuse us (cluster mode wraps
# them into a RedisClusterException's message, so the type alone does not tell).
_AUTH_WORDS = ("username-password", "authenticat", "NOAUTH", "WRONGPASS")
_TLS_WORDS = ("SSL", "TLS", "certificate")


def _hint(error: BaseException) -> str:
    """What to check when Redis refuses us rather than being away."""
    text = str(error)
    if isinstance(error, redis.exceptions.AuthenticationError) or any(
        word in text for word in _AUTH_WORDS
    ):
        return ": Redis refused the credentials (check --redis-username, --redis-password-file)"
    if isinstance(error, ssl.SSLError) or any(word in text for word in _TLS_WORDS):
        return ": the TLS handshake failed (check the rediss:// URL and --redis-tls-* files)"
    return ""


def _close(operation: Awaitable[Any]) -> None:
    # An operation never awaited must be closed, or Python warns it was never awaited.
    close = getattr(operation, "close", None)
    if close is not None:
        close()
