"""The encoder's Redis flags: an ACL user, a password from a file or the environment
(never argv, never shown), TLS files for rediss:// URLs, the MAC key file, and flags that
cannot work together refused at start with the reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from encoder_service.config import EncoderConfig
from encoder_service.main import build_parser
from encoder_service.redis_connection import (
    RedisConnection,
    RedisSettingsError,
    connection_from_config,
    redis_settings,
)

PASSWORD = "s3cret-Pa55word"
URL = "rediss://redis.example:6380/0"


def config_of(args: list[str], monkeypatch: pytest.MonkeyPatch, **env: str) -> EncoderConfig:
    for name in ("TESSERA_REDIS_PASSWORD", "TESSERA_CACHE_MAC_KEY_FILE", "TESSERA_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return EncoderConfig.from_args(build_parser().parse_args(["--model", "m", *args]))


def password_file(tmp_path: Path, text: str = PASSWORD + "\n") -> str:
    path = tmp_path / "password"
    path.write_text(text)
    return str(path)


def test_tls_acl_user_and_password_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = ["--redis-tls-ca-file", "ca.pem", "--redis-tls-cert-file", "c.pem"]
    tls += ["--redis-tls-key-file", "k.pem"]
    user = ["--redis-username", "tessera", "--redis-password-file", password_file(tmp_path)]
    config = config_of(["--redis-url", URL, *user, *tls], monkeypatch)
    connection = connection_from_config(config)
    assert connection.client_options() == {
        "username": "tessera",
        "password": PASSWORD,  # without the file's line ending
        "ssl_ca_certs": "ca.pem",
        "ssl_certfile": "c.pem",
        "ssl_keyfile": "k.pem",
    }
    assert connection.describe() == f"{URL} user=tessera password=set tls=client-cert"
    assert PASSWORD not in repr(connection) and PASSWORD not in repr(config)


def test_password_from_the_environment_read_when_the_parser_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_REDIS_PASSWORD", PASSWORD)
    parser = build_parser()
    monkeypatch.delenv("TESSERA_REDIS_PASSWORD")
    args = parser.parse_args(["--model", "m", "--redis-url", "redis://r:6379/0"])
    assert PASSWORD not in repr(args)
    config = EncoderConfig.from_args(args)
    assert PASSWORD not in repr(config)
    assert connection_from_config(config).client_options() == {"password": PASSWORD}
    # the file flag wins over the environment's default
    other = config_of(
        ["--redis-url", "redis://r:6379/0", "--redis-password-file", password_file(tmp_path, "x")],
        monkeypatch,
        TESSERA_REDIS_PASSWORD=PASSWORD,
    )
    assert connection_from_config(other).password == "x"


def test_a_password_in_the_url_works_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_of(["--redis-url", f"redis://tessera:{PASSWORD}@r:6379/0"], monkeypatch)
    with caplog.at_level(logging.WARNING):
        connection = connection_from_config(config)
    assert "--redis-password-file" in caplog.text
    assert PASSWORD not in caplog.text
    assert connection.describe() == "redis://tessera:***@r:6379/0"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"url": "redis://r:6379/0", "tls_ca_file": "ca.pem"}, "need a rediss:// URL"),
        ({"url": URL, "tls_cert_file": "c.pem"}, "together"),
        ({"url": URL, "tls_key_file": "k.pem"}, "together"),
        ({"url": "redis://:pw@r:6379/0", "password": "pw"}, "given twice"),
        ({"url": "redis://alice@r:6379/0", "username": "bob"}, "another Redis user"),
    ],
)
def test_flags_that_do_not_fit_together_are_refused(kwargs: dict, reason: str) -> None:
    with pytest.raises(RedisSettingsError, match=reason):
        RedisConnection(**kwargs)


def test_unreadable_secrets_stop_the_encoder_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "missing")
    for flags, reason in [
        (["--redis-password-file", missing], "cannot read the Redis password file"),
        (["--redis-password-file", password_file(tmp_path, "\n")], "is empty"),
        (["--cache-mac-key-file", missing], "cannot read the cache MAC key file"),
    ]:
        config = config_of(["--redis-url", "redis://r:6379/0", *flags], monkeypatch)
        with pytest.raises(SystemExit, match=reason):
            redis_settings(config)


def test_entries_are_authenticated_only_with_a_mac_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    redis = ["--redis-url", "redis://r:6379/0"]
    with caplog.at_level(logging.WARNING):
        settings = redis_settings(config_of(redis, monkeypatch))
    assert settings is not None and not settings.mac.keyed
    assert "unkeyed checksums" in caplog.text
    assert settings.describe().endswith("redis_entries=unauthenticated")
    key = tmp_path / "mac-key"
    key.write_text("0123456789abcdef" * 4 + "\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        # env TESSERA_CACHE_MAC_KEY_FILE, read when the parser is built
        keyed = redis_settings(config_of(redis, monkeypatch, TESSERA_CACHE_MAC_KEY_FILE=str(key)))
    assert keyed is not None and keyed.mac.keyed
    assert caplog.text == ""
    assert keyed.describe().endswith(f"redis_entries=mac:{keyed.mac.key_id}")
    assert redis_settings(config_of([], monkeypatch)) is None
