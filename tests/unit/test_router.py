"""Replica choice: encoders by rendezvous hashing of the content hash (stable, fair,
minimal movement), decoders by fewest outstanding requests."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from gateway.router import DecoderRouter
from tessera.channels import ChannelPool
from tessera.rendezvous import encoder_order, rendezvous_order
from tessera.replicas import ReplicaSet, on_this_host, resolve

ENCODERS = ["10.0.0.1:50052", "10.0.0.2:50052", "10.0.0.3:50052"]
HASHES = [hashlib.blake2b(str(i).encode(), digest_size=32).hexdigest() for i in range(1000)]


def replicas(*addresses: str) -> ReplicaSet:
    return ReplicaSet("test", list(addresses), ChannelPool(), retry_seconds=60)


def first_choices(addresses: list[str]) -> dict[str, str]:
    return {h: rendezvous_order(h, addresses)[0] for h in HASHES}


def test_order_is_a_deterministic_permutation():
    for content_hash in HASHES[:50]:
        order = rendezvous_order(content_hash, ENCODERS)
        assert sorted(order) == sorted(ENCODERS)
        assert rendezvous_order(content_hash, ENCODERS) == order


def test_order_does_not_depend_on_how_addresses_are_listed():
    for content_hash in HASHES[:50]:
        assert rendezvous_order(content_hash, ENCODERS) == rendezvous_order(
            content_hash, list(reversed(ENCODERS))
        )


def test_order_depends_on_the_item():
    orders = {tuple(rendezvous_order(h, ENCODERS)) for h in HASHES[:50]}
    assert len(orders) > 1


def test_each_encoder_gets_a_fair_share():
    counts = Counter(first_choices(ENCODERS).values())
    assert set(counts) == set(ENCODERS)
    for address in ENCODERS:
        assert 0.20 < counts[address] / len(HASHES) < 0.47, counts


def test_removing_an_encoder_moves_only_its_items():
    before = first_choices(ENCODERS)
    removed = ENCODERS[1]
    after = first_choices([a for a in ENCODERS if a != removed])
    for content_hash, owner in before.items():
        if owner == removed:
            assert after[content_hash] != removed
            # The item goes to its second choice, as a gateway routing around it would.
            assert after[content_hash] == rendezvous_order(content_hash, ENCODERS)[1]
        else:
            assert after[content_hash] == owner


def test_adding_an_encoder_moves_items_only_to_it():
    before = first_choices(ENCODERS)
    added = "10.0.0.4:50052"
    after = first_choices([*ENCODERS, added])
    moved = [h for h in HASHES if after[h] != before[h]]
    assert moved, "the new encoder should take some items"
    assert all(after[h] == added for h in moved)
    assert 0.15 < len(moved) / len(HASHES) < 0.35


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("127.0.0.1:50052", True),
        ("127.0.1.1:50052", True),  # Debian's hostname address
        ("[::1]:50052", True),
        ("localhost:50052", True),
        ("dns:///localhost:50052", True),
        ("0.0.0.0:50052", True),
        ("10.0.0.7:50052", False),
        ("[fd00::7]:50052", False),
        ("tessera-encoder:50052", False),  # a name could be anywhere
        ("dns:///tessera-encoder.default.svc:50052", False),
    ],
)
def test_a_target_on_this_host_is_a_loopback_or_unspecified_address(target, expected):
    assert on_this_host(target) is expected


def test_single_encoder_and_none():
    assert rendezvous_order(HASHES[0], ["only:1"]) == ["only:1"]
    assert rendezvous_order(HASHES[0], []) == []


# --- decoders --------------------------------------------------------------------------


def test_decoder_router_picks_least_outstanding():
    router = DecoderRouter(replicas("d1", "d2", "d3"))
    assert [router.acquire() for _ in range(3)] == ["d1", "d2", "d3"]
    router.release("d2")
    assert router.acquire() == "d2"
    assert router.acquire() == "d1"  # all at 2 again: earliest listed wins the tie


def test_decoder_router_spreads_concurrent_requests():
    router = DecoderRouter(replicas("d1", "d2"))
    counts = Counter(router.acquire() for _ in range(10))
    assert counts == Counter({"d1": 5, "d2": 5})


def test_decoder_router_release_makes_a_busy_decoder_preferred_again():
    router = DecoderRouter(replicas("d1", "d2"))
    router.acquire()  # d1
    router.acquire()  # d2
    router.acquire()  # d1 (now 2)
    router.release("d1")
    router.release("d1")
    assert router.acquire() == "d1"


def test_decoder_router_skips_excluded_and_set_aside_decoders():
    decoders = replicas("d1", "d2", "d3")
    router = DecoderRouter(decoders)
    decoders.mark_down("d1", "test")
    assert router.acquire(exclude=["d2"]) == "d3"
    assert router.acquire(exclude=["d2", "d3"]) is None
    decoders.mark_up("d1")
    assert router.acquire(exclude=["d2", "d3"]) == "d1"


def test_all_replicas_set_aside_are_all_offered():
    encoders = replicas(*ENCODERS)
    for address in ENCODERS:
        encoders.mark_down(address, "test")
    assert sorted(encoders.live()) == sorted(ENCODERS)


def test_encoder_order_puts_set_aside_encoders_last():
    encoders = replicas(*ENCODERS)
    for content_hash in HASHES[:50]:
        first = rendezvous_order(content_hash, ENCODERS)[0]
        encoders.mark_down(first, "test")
        order = encoder_order(content_hash, encoders)
        assert order[-1] == first and sorted(order) == sorted(ENCODERS)
        assert order[:-1] == rendezvous_order(content_hash, [a for a in ENCODERS if a != first])
        encoders.mark_up(first)


def test_dns_targets_resolve_to_every_address():
    import asyncio

    addresses = asyncio.run(resolve("dns:///localhost:50052"))
    assert "127.0.0.1:50052" in addresses
    assert asyncio.run(resolve("10.1.2.3:7")) == ["10.1.2.3:7"]


def test_replica_set_resolves_dns_targets_on_start():
    import asyncio

    async def started() -> list[str]:
        replica_set = ReplicaSet("test", ["dns:///localhost:9", "10.0.0.9:9"], ChannelPool())
        await replica_set.refresh()
        return replica_set.addresses

    addresses = asyncio.run(started())
    assert "127.0.0.1:9" in addresses and "10.0.0.9:9" in addresses
