"""Open-loop load for the chaos and soak harnesses: a fixed mix of prompt variants
(text; images from a small pool, cached; images new to the fleet), sent at a fixed rate
whatever the fleet does, each answer judged against the healthy run's.

New images stay new in every run without new pixels: their requests carry a cache salt
of their own, which changes their content hash (and the prefix cache's keys), not the
answer.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from tessera.client import Client, Message, SamplingParams
from tessera.testbed.media import noise_image

MAX_NEW_TOKENS = 8
MAX_CHUNK_TOKENS = 16  # items cut across chunks: every chunk fetches its own rows
POOL_SALT = "chaos-pool"
TEXTS = [
    "Tell me about the lake at night.",
    "What do trains and rivers share?",
    "Describe a quiet morning in the hills.",
    "Name three colours of the sea.",
]


@dataclass(frozen=True)
class Variant:
    """One prompt of the mix; `kind` is "text", "cached-image" or "new-image"."""

    index: int
    kind: str
    messages: tuple[Message, ...]


def variants() -> list[Variant]:
    """4 text prompts, 4 over a pool of 2 images, 4 over images seen once per run."""
    found = [Variant(i, "text", (Message("user", [text]),)) for i, text in enumerate(TEXTS)]
    for i, text in enumerate(TEXTS):
        image = noise_image(7100 + i % 2, 36 + 4 * (i % 2), 32)
        found.append(Variant(len(found), "cached-image", (Message("user", [image, text]),)))
    for i, text in enumerate(TEXTS):
        image = noise_image(7200 + i, 30 + 2 * i, 40)
        found.append(Variant(len(found), "new-image", (Message("user", [image, text]),)))
    return found


@dataclass
class Outcome:
    """What one request gave the client."""

    variant: int
    sent_at: float
    ended_at: float
    status: str  # "OK" or the gRPC status code's name
    detail: str = ""
    token_ids: list[int] = field(default_factory=list)
    num_retries: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "OK"


def send(address: str, variant: Variant, salt: str, deadline_seconds: float) -> Outcome:
    """One request as a client application would send it: retried (by the client) on
    UNAVAILABLE or RESOURCE_EXHAUSTED before any output, within its deadline."""
    cache_salt = salt if variant.kind == "new-image" else POOL_SALT
    sent_at = time.monotonic()
    with Client(address, timeout_seconds=deadline_seconds) as client:
        try:
            done = client.complete(
                list(variant.messages),
                SamplingParams(max_tokens=MAX_NEW_TOKENS),
                max_chunk_tokens=MAX_CHUNK_TOKENS,
                cache_salt=cache_salt,
            )
        except grpc.RpcError as error:
            return Outcome(
                variant.index,
                sent_at,
                time.monotonic(),
                error.code().name,
                error.details() or "",
                num_retries=client.num_retries,
            )
        return Outcome(
            variant.index,
            sent_at,
            time.monotonic(),
            "OK",
            token_ids=list(done.token_ids),
            num_retries=client.num_retries,
        )


def healthy_answers(address: str, deadline_seconds: float = 120.0) -> dict[int, list[int]]:
    """Every variant once on the healthy fleet: the answers later runs must give."""
    answers = {}
    for variant in variants():
        outcome = send(address, variant, "chaos-healthy", deadline_seconds)
        if not outcome.ok:
            raise RuntimeError(f"the healthy run failed: {outcome.status} {outcome.detail}")
        answers[variant.index] = outcome.token_ids
    return answers


class OpenLoop:
    """Sends variant after variant at `rate_per_second` from `start()` until `stop()`,
    never waiting for answers (an open loop: a slow fleet gets more, not fewer,
    requests in flight). At most `max_requests` are sent; each has its own deadline."""

    def __init__(
        self,
        address: str,
        salt: str,
        rate_per_second: float,
        deadline_seconds: float = 60.0,
        max_requests: int = 10_000,
    ) -> None:
        self.address = address
        self.salt = salt
        self.interval = 1.0 / rate_per_second
        self.deadline_seconds = deadline_seconds
        self.max_requests = max_requests
        self.outcomes: list[Outcome] = []
        self._variants = variants()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="load")
        self._thread = threading.Thread(target=self._send_all, name="open-loop", daemon=True)
        self._lock = threading.Lock()
        self.num_sent = 0

    def start(self) -> OpenLoop:
        self._thread.start()
        return self

    def _send_all(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set() and self.num_sent < self.max_requests:
            variant = self._variants[self.num_sent % len(self._variants)]
            salt = f"{self.salt}-{self.num_sent}"
            self._pool.submit(self._one, variant, salt)
            self.num_sent += 1
            next_at = started + self.num_sent * self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _one(self, variant: Variant, salt: str) -> None:
        outcome = send(self.address, variant, salt, self.deadline_seconds)
        with self._lock:
            self.outcomes.append(outcome)

    def stop(self) -> list[Outcome]:
        """Stops sending, waits for every request in flight (each ends by its deadline),
        and returns every outcome in the order they were sent."""
        self._stop.set()
        self._thread.join()
        self._pool.shutdown(wait=True)
        return sorted(self.outcomes, key=lambda outcome: outcome.sent_at)
