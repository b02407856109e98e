"""Where an item computes for a decoder other than at its first choice
(decoder_service.reencode): an encoder a fetch moved on to, for as long as any such
fetch waits there, heard of as the fetch gets there."""

from __future__ import annotations

import pytest

from decoder_service.reencode import Reencoder
from tessera.channels import ChannelPool
from tessera.replicas import ReplicaSet

ORDER = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


def reencoder() -> tuple[Reencoder, list[tuple[str, str]]]:
    encoders = ReplicaSet("encoder", ORDER, ChannelPool())
    made = Reencoder(encoders, lease_ms=1000, timeout_seconds=1.0, model_fingerprint="")
    heard: list[tuple[str, str]] = []
    made.on_announced = lambda address, content_hash: heard.append((address, content_hash))
    return made, heard


def test_a_fetch_at_the_first_choice_changes_nothing():
    made, heard = reencoder()
    with made.fetching(ORDER[0], "a" * 32, moved=False):
        assert made.computing_at(ORDER, "a" * 32) is None
    assert heard == []


def test_an_item_computes_where_its_fetches_moved_on_to_while_any_waits_there():
    made, heard = reencoder()
    with made.fetching(ORDER[1], "a" * 32, moved=True):
        assert heard == [(ORDER[1], "a" * 32)]
        assert made.computing_at(ORDER, "a" * 32) == ORDER[1]
        assert made.computing_at(ORDER, "b" * 32) is None  # another item
        with made.fetching(ORDER[1], "a" * 32, moved=True):  # another chunk of it
            pass
        assert made.computing_at(ORDER, "a" * 32) == ORDER[1]  # the first still waits
    assert made.computing_at(ORDER, "a" * 32) is None
    assert heard == [(ORDER[1], "a" * 32)] * 2


def test_a_fetch_that_fails_there_is_forgotten_too():
    made, _ = reencoder()
    with pytest.raises(ConnectionError), made.fetching(ORDER[2], "c" * 32, moved=True):
        raise ConnectionError("the next encoder failed as well")
    assert made.computing_at(ORDER, "c" * 32) is None


def test_a_listener_that_raises_never_fails_the_fetch(caplog):
    made, _ = reencoder()

    def failing(address: str, content_hash: str) -> None:
        raise RuntimeError("injected fault in the listener")

    made.on_announced = failing
    with made.fetching(ORDER[1], "d" * 32, moved=True):
        assert made.computing_at(ORDER, "d" * 32) == ORDER[1]
    assert "injected fault in the listener" in caplog.text
