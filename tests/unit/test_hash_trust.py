"""Whose content hashes the encoder takes as given (encoder_service.hash_trust): only
named roles, only with mutual TLS, only for the encoder's own model."""

from __future__ import annotations

import argparse

import pytest

from encoder_service.hash_trust import HashTrust, trusted_caller_names
from encoder_service.main import build_parser

OWN = "a" * 32
OTHER = "b" * 32


def test_only_a_named_caller_naming_this_model_is_trusted():
    trust = HashTrust.of(frozenset({"gateway"}), mutual_tls=True)
    assert trust.trusts("gateway", OWN, OWN)
    assert not trust.trusts("decoder", OWN, OWN)  # another role
    assert not trust.trusts("gateway", "", OWN)  # no fingerprint named: checked
    assert not trust.trusts("", OWN, OWN)  # no verified name


def test_without_mutual_tls_nobody_is_trusted():
    """No verified name without a CA: a caller the encoder has not authenticated is
    treated as hostile, whatever it claims to be."""
    trust = HashTrust.of(frozenset({"gateway"}), mutual_tls=False)
    assert not trust.trusts("gateway", OWN, OWN)
    assert trust.describe() == "none (every hash checked)"


def test_an_encode_for_another_model_is_refused_whoever_sends_it():
    trust = HashTrust.of(frozenset({"gateway"}), mutual_tls=True)
    for caller in ("gateway", "decoder", ""):
        with pytest.raises(ValueError, match="serves another model") as refused:
            trust.trusts(caller, OTHER, OWN)
        assert OWN not in str(refused.value), "the encoder's own fingerprint is not said"


def test_the_flag_names_roles_and_empty_trusts_nobody():
    parser = build_parser()
    base = ["--model", "m"]
    assert parser.parse_args(base).trust_content_hashes_from == frozenset({"gateway"})
    given = parser.parse_args([*base, "--trust-content-hashes-from", "gateway, decoder"])
    assert given.trust_content_hashes_from == frozenset({"gateway", "decoder"})
    nobody = parser.parse_args([*base, "--trust-content-hashes-from", ""])
    assert nobody.trust_content_hashes_from == frozenset()
    assert not HashTrust.of(nobody.trust_content_hashes_from, True).trusts("gateway", OWN, OWN)
    with pytest.raises(argparse.ArgumentTypeError, match="name the roles"):
        trusted_caller_names("gateway,*")
