"""What a fleet at rest must not hold: KV blocks of requests that ended, pinned items,
compute leases in Redis. Checked after load, polling until the fleet is quiet (pins of
a request whose release was lost end with their lease, `--lease-ms`)."""

from __future__ import annotations

import time

import grpc
import redis

from tessera.testbed.control import FleetControl
from tessera.v1 import decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc

LEASE_PATTERN = "tessera:lease:*"


def findings(fleet: FleetControl) -> list[str]:
    """Everything held now that should not be, one line each (empty: nothing)."""
    found = []
    for name in fleet.names("decoder"):
        with grpc.insecure_channel(fleet.address(name)) as channel:
            stats = decoder_pb2_grpc.DecoderServiceStub(channel).GetStats(
                decoder_pb2.GetDecoderStatsRequest(), timeout=10
            )
        if stats.num_running or stats.num_waiting:
            found.append(f"{name}: {stats.num_running} running, {stats.num_waiting} waiting")
        if stats.num_free_kv_blocks != stats.num_kv_blocks:
            held = stats.num_kv_blocks - stats.num_free_kv_blocks
            found.append(f"{name}: {held} KV blocks held with no request running")
    for name in fleet.names("encoder"):
        with grpc.insecure_channel(fleet.address(name)) as channel:
            stats = encoder_pb2_grpc.EncoderServiceStub(channel).GetStats(
                encoder_pb2.GetEncoderStatsRequest(), timeout=10
            )
        if stats.num_pinned_bytes:
            found.append(f"{name}: {stats.num_pinned_bytes} bytes still pinned")
    with redis.Redis.from_url(fleet.redis_url, socket_timeout=10) as client:
        leases = list(client.scan_iter(match=LEASE_PATTERN, count=1000))
    if leases:
        found.append(f"redis: {len(leases)} compute leases left")
    return found


def wait_quiet(fleet: FleetControl, max_seconds: float) -> list[str]:
    """Polls `findings` until it is empty or `max_seconds` pass; returns the last."""
    deadline = time.monotonic() + max_seconds
    while True:
        found = findings(fleet)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
