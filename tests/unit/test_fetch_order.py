"""Which encoders a decoder asks for an item: the request's hints it discovered itself,
in the request's order, then its own rendezvous order; never an address it did not
discover, never one twice."""

from __future__ import annotations

import hashlib

import pytest

from decoder_service.embedding_client import EmbeddingClient, FetchError, fetch_order
from tessera.channels import ChannelPool
from tessera.rendezvous import encoder_order
from tessera.replicas import ReplicaSet

ENCODERS = ["10.0.0.1:50052", "10.0.0.2:50052", "10.0.0.3:50052"]
HASHES = [hashlib.blake2b(str(i).encode(), digest_size=32).hexdigest() for i in range(50)]


def replicas(*addresses: str) -> ReplicaSet:
    return ReplicaSet("encoder", list(addresses), ChannelPool(), retry_seconds=60)


def test_without_hints_it_is_the_decoders_own_order():
    encoders = replicas(*ENCODERS)
    for content_hash in HASHES:
        assert fetch_order(content_hash, [], encoders) == encoder_order(content_hash, encoders)


def test_undiscovered_hints_are_left_out():
    encoders = replicas(*ENCODERS)
    hints = ["evil.example:443", "127.0.0.1:6379", "10.0.0.9:50052"]
    for content_hash in HASHES:
        assert fetch_order(content_hash, hints, encoders) == encoder_order(content_hash, encoders)


def test_discovered_hints_come_first_in_the_requests_order_then_the_rest_in_own_order():
    encoders = replicas(*ENCODERS)
    for content_hash in HASHES:
        own = encoder_order(content_hash, encoders)
        hints = [own[2], "evil:1", own[1]]  # against the decoder's own ranking
        assert fetch_order(content_hash, hints, encoders) == [own[2], own[1], own[0]]


def test_no_address_twice():
    encoders = replicas(*ENCODERS)
    for content_hash in HASHES:
        order = fetch_order(content_hash, [ENCODERS[1], ENCODERS[1], ENCODERS[0]], encoders)
        assert order[:2] == [ENCODERS[1], ENCODERS[0]]
        assert sorted(order) == sorted(ENCODERS)


def test_set_aside_encoders_keep_a_hints_place_and_come_last_otherwise():
    encoders = replicas(*ENCODERS)
    encoders.mark_down(ENCODERS[0], "test")
    for content_hash in HASHES:
        assert fetch_order(content_hash, [ENCODERS[0]], encoders)[0] == ENCODERS[0]
        assert fetch_order(content_hash, [], encoders)[-1] == ENCODERS[0]


def test_nothing_discovered_nothing_to_ask():
    assert fetch_order(HASHES[0], ENCODERS, replicas()) == []


def client(encoders: ReplicaSet) -> EmbeddingClient:
    return EmbeddingClient(encoders, row_width=8, lease_ms=1000, timeout_seconds=1.0)


def test_a_decoder_without_encoders_says_which_flag_is_missing():
    with pytest.raises(FetchError, match="--encoders"):
        client(replicas()).require_encoders()
    client(replicas(*ENCODERS)).require_encoders()  # some: fine


def test_a_dns_name_that_resolved_to_nothing_yet_is_named():
    unresolved = ReplicaSet("encoder", ["dns:///tessera-encoder:50052"], ChannelPool())
    with pytest.raises(FetchError, match="no encoder discovered from --encoders dns:///"):
        client(unresolved).require_encoders()
