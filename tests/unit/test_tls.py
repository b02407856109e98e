"""TLS files and caller rules, without servers: which combinations of files are valid,
when changed files are taken up (and when a half-done rotation is not), how
--allow-callers reads, and the name a DNS-discovered replica's certificate must carry."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from tessera.access import ANY_CALLER, AccessRules, add_allow_callers_flag, rules_from_args
from tessera.certs import install, issue, new_authority, write_role_certificates
from tessera.channels import ChannelPool
from tessera.replicas import ReplicaSet
from tessera.tls import TlsFiles, TlsFilesError, TlsWatch, read_material, tls_args

RULES = AccessRules(
    "tessera.v1.EncoderService",
    {"Encode": frozenset({"gateway", "decoder"}), "GetStats": frozenset({ANY_CALLER})},
)


def test_a_certificate_needs_its_key_and_plaintext_is_the_default():
    with pytest.raises(ValueError, match="go together"):
        TlsFiles(cert_file="a.pem")
    assert not TlsFiles().enabled
    assert TlsFiles("a.pem", "a.key").enabled and not TlsFiles("a.pem", "a.key").mutual
    assert TlsFiles("a.pem", "a.key", "ca.pem").mutual
    assert TlsFiles(ca_file="ca.pem").enabled and not TlsFiles(ca_file="ca.pem").mutual
    assert tls_args(TlsFiles(ca_file="ca.pem")) == ["--tls-ca-file", "ca.pem"]


def test_a_key_of_another_certificate_is_refused(tmp_path: Path):
    authority = new_authority()
    files = write_role_certificates(tmp_path, ["encoder"], authority)["encoder"]
    Path(files.key_file).write_bytes(issue(authority, "encoder").key_pem)
    with pytest.raises(ValueError, match="does not belong"):
        read_material(files)
    with pytest.raises(TlsFilesError, match="does not belong"):
        TlsWatch(files)


def test_the_watch_takes_up_a_rotation_only_once_the_pair_fits(tmp_path: Path):
    authority = new_authority()
    files = write_role_certificates(tmp_path, ["encoder"], authority)["encoder"]
    watch = TlsWatch(files)
    first = watch.material
    assert watch.refresh() is None  # unchanged
    rotated = issue(authority, "encoder")
    Path(files.key_file + ".new").write_bytes(rotated.key_pem)
    Path(files.key_file + ".new").replace(files.key_file)  # the key first, as a rename
    assert watch.refresh() is None and watch.material == first  # half done: keep the old
    install(rotated, files)
    material = watch.refresh()
    assert material is not None and material.cert == rotated.cert_pem
    assert watch.material == material and watch.refresh() is None


def parse_rules(*flags: str) -> AccessRules:
    parser = argparse.ArgumentParser()
    add_allow_callers_flag(parser, RULES)
    return rules_from_args(parser.parse_args(list(flags)), RULES)


def test_allow_callers_replaces_one_method_and_knows_the_methods():
    assert parse_rules() == RULES
    rules = parse_rules("--allow-callers", "Encode=gateway, client")
    assert rules.allowed["Encode"] == {"gateway", "client"}
    assert rules.allowed["GetStats"] == {ANY_CALLER}
    with pytest.raises(SystemExit, match="has no method Generate"):
        parse_rules("--allow-callers", "Generate=gateway")
    with pytest.raises(SystemExit):
        parse_rules("--allow-callers", "Encode=")


def test_health_is_open_reflection_any_and_unknown_methods_closed():
    assert RULES.callers_for("/grpc.health.v1.Health/Check") is None
    assert RULES.callers_for("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") == {
        ANY_CALLER
    }
    assert RULES.callers_for("/tessera.v1.EncoderService/Encode") == {"gateway", "decoder"}
    assert RULES.callers_for("/tessera.v1.EncoderService/Unknown") == frozenset()
    assert RULES.callers_for("/tessera.v1.DecoderService/GetStats") == frozenset()


def test_a_replica_found_by_dns_name_is_checked_against_that_name():
    async def scenario() -> None:
        pool = ChannelPool()
        replicas = ReplicaSet("encoder", ["dns:///localhost:50052", "127.0.0.1:50053"], pool)
        await replicas.refresh()
        found = [a for a in replicas.addresses if a.endswith(":50052")]
        assert found and all(pool._server_names[a] == "localhost" for a in found)
        assert "127.0.0.1:50053" not in pool._server_names  # dialed as given
        await pool.close()

    asyncio.run(scenario())
