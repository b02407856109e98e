"""The channel pool is bounded, and a ReplicaSet dials only the replicas it holds: it
refuses any other address and retires the channels of replicas that leave."""

from __future__ import annotations

import asyncio

import pytest

from tessera.channels import ChannelPool, ChannelPoolFullError
from tessera.replicas import ReplicaSet, UnknownReplicaError


def run(coroutine):
    return asyncio.run(coroutine)


def test_one_channel_per_address_up_to_the_bound():
    async def scenario() -> None:
        pool = ChannelPool(max_channels=2)
        first = pool.get("10.0.0.1:1")
        assert pool.get("10.0.0.1:1") is first
        pool.get("10.0.0.2:1")
        with pytest.raises(ChannelPoolFullError, match=r"10\.0\.0\.3:1.*2 channels"):
            pool.get("10.0.0.3:1")
        assert len(pool) == 2 and "10.0.0.3:1" not in pool
        assert pool.get("10.0.0.1:1") is first  # a known address still gets its channel
        await pool.close()

    run(scenario())


def test_a_retired_channel_frees_its_place_and_is_closed():
    async def scenario() -> None:
        pool = ChannelPool(max_channels=1)
        old = pool.get("10.0.0.1:1")
        pool.retire("10.0.0.1:1", grace_seconds=5)
        pool.retire("10.0.0.1:1", grace_seconds=5)  # twice: nothing left to retire
        assert len(pool) == 0
        new = pool.get("10.0.0.2:1")
        assert new is not old
        await asyncio.gather(*pool._closing)  # no calls in flight: closes at once
        with pytest.raises(Exception, match="Channel is closed"):  # grpc's UsageError
            await old.unary_unary("/x.Y/Z")(b"", timeout=1)
        await pool.close()

    run(scenario())


def test_the_pool_needs_room_for_one_channel():
    with pytest.raises(ValueError):
        ChannelPool(max_channels=0)


def test_a_replica_set_dials_only_its_own_replicas():
    async def scenario() -> None:
        pool = ChannelPool()
        replicas = ReplicaSet("encoder", ["10.0.0.1:1", "10.0.0.2:1"], pool)
        assert replicas.channel("10.0.0.1:1") is pool.get("10.0.0.1:1")
        with pytest.raises(UnknownReplicaError, match="not a discovered encoder"):
            replicas.channel("evil.example:443")
        assert "evil.example:443" not in pool
        await pool.close()

    run(scenario())


def test_replicas_that_leave_have_their_channels_retired():
    async def scenario() -> None:
        pool = ChannelPool()
        replicas = ReplicaSet("encoder", ["10.0.0.1:1", "10.0.0.2:1"], pool)
        replicas.channel("10.0.0.1:1")
        replicas.channel("10.0.0.2:1")
        replicas.targets = ["10.0.0.2:1", "10.0.0.3:1"]  # as a DNS name's answer changes
        await replicas.refresh()
        assert replicas.addresses == ["10.0.0.2:1", "10.0.0.3:1"]
        assert "10.0.0.1:1" not in pool and "10.0.0.2:1" in pool
        with pytest.raises(UnknownReplicaError):
            replicas.channel("10.0.0.1:1")
        await pool.close()

    run(scenario())
