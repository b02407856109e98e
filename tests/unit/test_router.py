"""Replica choice: encoders by rendezvous hashing of the content hash (stable, fair,
minimal movement), decoders by fewest outstanding requests."""

from __future__ import annotations

import hashlib
from collections import Counter

from gateway.router import DecoderRouter, rendezvous_order

ENCODERS = ["10.0.0.1:50052", "10.0.0.2:50052", "10.0.0.3:50052"]
HASHES = [hashlib.blake2b(str(i).encode(), digest_size=32).hexdigest() for i in range(1000)]


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


def test_single_encoder_and_none():
    assert rendezvous_order(HASHES[0], ["only:1"]) == ["only:1"]
    assert rendezvous_order(HASHES[0], []) == []


# --- decoders --------------------------------------------------------------------------


def test_decoder_router_picks_least_outstanding():
    router = DecoderRouter(["d1", "d2", "d3"])
    assert [router.acquire() for _ in range(3)] == ["d1", "d2", "d3"]
    router.release("d2")
    assert router.acquire() == "d2"
    assert router.acquire() == "d1"  # all at 2 again: earliest listed wins the tie


def test_decoder_router_spreads_concurrent_requests():
    router = DecoderRouter(["d1", "d2"])
    counts = Counter(router.acquire() for _ in range(10))
    assert counts == Counter({"d1": 5, "d2": 5})


def test_decoder_router_release_makes_a_busy_decoder_preferred_again():
    router = DecoderRouter(["d1", "d2"])
    router.acquire()  # d1
    router.acquire()  # d2
    router.acquire()  # d1 (now 2)
    router.release("d1")
    router.release("d1")
    assert router.acquire() == "d1"
