"""The fault schedule: each fault a row of docs/reliability.md, played over a
FleetControl while the open-loop load runs.

`keeps_every_role`: the fault leaves at least one healthy replica of every role
(Redis is a cache, not a role a request needs), so no request may fail.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import redis

from tessera.testbed.control import FleetControl, LinkShape

FILLER_PREFIX = "chaos:filler:"
FILLER_BYTES = 64 << 10
ENTRY_PATTERN = "tessera:emb:*"


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Callable[[FleetControl], None]
    recover: Callable[[FleetControl], None]
    hold_seconds: float
    keeps_every_role: bool = True
    needs_network: bool = False


def no_action(fleet: FleetControl) -> None:
    pass


def _redis(fleet: FleetControl) -> redis.Redis:
    return redis.Redis.from_url(fleet.redis_url, socket_timeout=10)


def fill_redis(fleet: FleetControl) -> None:
    """Caps Redis just above what it holds, refusing writes past it (noeviction), and
    fills it to the cap: every write the encoders try is refused with OOM."""
    with _redis(fleet) as client:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", str(used + (4 << 20)))
        filler = b"\0" * FILLER_BYTES
        for index in itertools.count():
            try:
                client.set(f"{FILLER_PREFIX}{index}", filler)
            except redis.ResponseError:  # OOM: full
                return


def empty_redis(fleet: FleetControl) -> None:
    with _redis(fleet) as client:
        keys = list(client.scan_iter(match=f"{FILLER_PREFIX}*", count=1000))
        if keys:
            client.delete(*keys)
        client.config_set("maxmemory", "0")


def corrupt_entries(fleet: FleetControl) -> None:
    """Flips a byte in the rows of every embedding entry, then restarts encoder-0 so
    that the items it held in memory must come from Redis again (where they are now
    corrupt: checked, deleted and recomputed, never served)."""
    with _redis(fleet) as client:
        for key in client.scan_iter(match=ENTRY_PATTERN, count=1000):
            value = client.get(key)
            if value:
                corrupt = bytearray(value)
                corrupt[-5] ^= 0xFF
                client.set(key, bytes(corrupt), keepttl=True)
    fleet.restart("encoder-0")


def rolling_restart(fleet: FleetControl) -> None:
    """Every encoder in turn: SIGTERM, start again, wait until it serves."""
    for name in fleet.names("encoder"):
        fleet.terminate(name)
        fleet.restart(name)


def _pairs(fleet: FleetControl) -> list[tuple[str, str]]:
    return [(d, e) for d in fleet.names("decoder") for e in fleet.names("encoder")]


SLOW = LinkShape(delay_ms=200, loss_percent=1)


def slow_links(fleet: FleetControl) -> None:
    for decoder, encoder in _pairs(fleet):
        fleet.shape(decoder, encoder, SLOW)


def fast_links(fleet: FleetControl) -> None:
    for decoder, encoder in _pairs(fleet):
        fleet.unshape(decoder, encoder)


def isolate_encoder(fleet: FleetControl) -> None:
    for decoder in fleet.names("decoder"):
        fleet.partition(decoder, "encoder-2")


def reconnect_encoder(fleet: FleetControl) -> None:
    for decoder in fleet.names("decoder"):
        fleet.heal(decoder, "encoder-2")


def _encoder_ips(fleet: FleetControl) -> list[str]:
    return [fleet.address(name).rsplit(":", 1)[0] for name in fleet.names("encoder")]


def drop_an_encoder_from_dns(fleet: FleetControl) -> None:
    fleet.set_dns("encoders", _encoder_ips(fleet)[:-1])


def restore_dns(fleet: FleetControl) -> None:
    fleet.set_dns("encoders", _encoder_ips(fleet))


def _each(action: Callable[[FleetControl, str], None], role: str):
    def on_every_replica(fleet: FleetControl) -> None:
        for name in fleet.names(role):
            action(fleet, name)

    return on_every_replica


def schedule() -> list[Fault]:
    return [
        Fault(
            "encoder-kill-9",
            "SIGKILL encoder-1 while its rows stream; restart it",
            lambda f: f.kill("encoder-1"),
            lambda f: f.restart("encoder-1"),
            5,
        ),
        Fault(
            "encoder-sigstop",
            "SIGSTOP encoder-0 for 5 s (connections open, nothing answers)",
            lambda f: f.pause("encoder-0"),
            lambda f: f.resume("encoder-0"),
            5,
        ),
        Fault(
            "encoder-partition",
            "encoder-2 cut off from both decoders, not from the gateway, 10 s",
            isolate_encoder,
            reconnect_encoder,
            10,
            needs_network=True,
        ),
        Fault(
            "redis-kill",
            "SIGKILL Redis; restart it empty after 5 s",
            lambda f: f.kill("redis"),
            lambda f: f.restart("redis"),
            5,
        ),
        Fault(
            "redis-pause",
            "SIGSTOP Redis for 5 s",
            lambda f: f.pause("redis"),
            lambda f: f.resume("redis"),
            5,
        ),
        Fault(
            "redis-full",
            "Redis filled to its maxmemory (noeviction: writes refused) for 10 s",
            fill_redis,
            empty_redis,
            10,
        ),
        Fault(
            "redis-corrupt",
            "a byte flipped in every Redis entry; encoder-0 restarted to read them",
            corrupt_entries,
            no_action,
            0,
        ),
        Fault(
            "decoder-drain",
            "SIGTERM decoder-0 (drains, exits); start it again after 3 s",
            lambda f: f.terminate("decoder-0"),
            lambda f: f.restart("decoder-0"),
            3,
        ),
        Fault(
            "decoder-kill-9",
            "SIGKILL decoder-1 mid-generation; restart it after 5 s",
            lambda f: f.kill("decoder-1"),
            lambda f: f.restart("decoder-1"),
            5,
        ),
        Fault(
            "encoder-rolling-restart",
            "every encoder in turn: SIGTERM, start, wait until serving",
            rolling_restart,
            no_action,
            0,
        ),
        Fault(
            "slow-links",
            "200 ms added latency each way and 1% loss on every decoder-encoder link, 15 s",
            slow_links,
            fast_links,
            15,
            needs_network=True,
        ),
        Fault(
            "every-decoder-down",
            "SIGKILL both decoders; restart them after 5 s (no replica left)",
            _each(lambda f, name: f.kill(name), "decoder"),
            _each(lambda f, name: f.restart(name), "decoder"),
            5,
            keeps_every_role=False,
        ),
        Fault(
            "every-encoder-stopped",
            "SIGSTOP all three encoders for 8 s (no replica answers)",
            _each(lambda f, name: f.pause(name), "encoder"),
            _each(lambda f, name: f.resume(name), "encoder"),
            8,
            keeps_every_role=False,
        ),
        Fault(
            "dns-change",
            "`encoders` answers only 2 of 3 replicas for 10 s, then all 3 again",
            drop_an_encoder_from_dns,
            restore_dns,
            10,
            needs_network=True,
        ),
    ]
