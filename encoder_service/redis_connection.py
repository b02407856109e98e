"""How an encoder reaches Redis: the URL, cluster mode, an ACL user and password, TLS.

The password comes from a file (`--redis-password-file`, e.g. a mounted Kubernetes
Secret) or from TESSERA_REDIS_PASSWORD, so it is in neither argv (`ps`) nor a ConfigMap.
A password inside the URL still works, with a warning. `rediss://` URLs use TLS, with
the CA that signed the server's certificate and, for servers that authenticate clients
(`tls-auth-clients yes`), a client certificate and key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from encoder_service.config import EncoderConfig
from encoder_service.entry_mac import UNKEYED, EntryMac, MacKeyError
from tessera.server import redact

log = logging.getLogger(__name__)

# redis-py's own retries: for quick transient failures (a pooled connection the server
# closed); the store's per-call deadline still bounds the total time.
CLIENT_RETRIES = 2


class RedisSettingsError(ValueError):
    """Redis flags that cannot work together, or a password file that cannot be read."""


@dataclass(frozen=True)
class RedisConnection:
    """Where Redis is and how to prove who we are to it."""

    url: str
    cluster: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        tls_files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if any(tls_files) and parts.scheme != "rediss":
            raise RedisSettingsError("--redis-tls-* files need a rediss:// URL")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise RedisSettingsError("give --redis-tls-cert-file and --redis-tls-key-file together")
        if parts.password and self.password is not None:
            raise RedisSettingsError(
                "the Redis password is given twice, in the URL and in --redis-password-file "
                "or TESSERA_REDIS_PASSWORD: keep only the file"
            )
        if parts.username and self.username and unquote(parts.username) != self.username:
            raise RedisSettingsError("the URL names another Redis user than --redis-username")

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    def client_options(self) -> dict[str, Any]:
        """redis-py keyword arguments beyond the URL (the URL's own values win there)."""
        options: dict[str, Any] = {}
        if self.username:
            options["username"] = self.username
        if self.password is not None:
            options["password"] = self.password
        if self.tls:
            options.update(
                ssl_ca_certs=self.tls_ca_file,
                ssl_certfile=self.tls_cert_file,
                ssl_keyfile=self.tls_key_file,
            )
        return options

    def describe(self) -> str:
        """For the start line: never the password itself, only where it came from."""
        parts = [redact(self.url)]
        if self.username:
            parts.append(f"user={self.username}")
        if self.password is not None:
            parts.append("password=set")
        if self.tls:
            parts.append("tls=client-cert" if self.tls_cert_file else "tls=on")
        return " ".join(parts)


@dataclass(frozen=True)
class RedisSettings:
    """Redis as the flags describe it, secrets read and checked before anything loads."""

    connection: RedisConnection
    mac: EntryMac

    def describe(self) -> str:
        entries = f"mac:{self.mac.key_id}" if self.mac.keyed else "unauthenticated"
        return f"{self.connection.describe()} redis_entries={entries}"


def redis_settings(config: EncoderConfig) -> RedisSettings | None:
    """None without --redis-url; exits with the reason if a secret cannot be read or
    the flags do not fit together."""
    if not config.redis_url:
        return None
    try:
        connection = connection_from_config(config)
        mac = EntryMac.from_file(config.cache_mac_key_file) if config.cache_mac_key_file else None
    except (RedisSettingsError, MacKeyError) as error:
        raise SystemExit(f"tessera encoder: {error}") from None
    if mac is None:
        log.warning(
            "no --cache-mac-key-file: Redis entries carry unkeyed checksums, so anyone who "
            "can write to Redis can make this encoder serve rows of their choosing"
        )
    return RedisSettings(connection, mac or UNKEYED)


def connection_from_config(config: EncoderConfig) -> RedisConnection:
    """The connection the flags describe, the password file read now (at start)."""
    assert config.redis_url, "only called with --redis-url"
    password = config.redis_password.value if config.redis_password else None
    if config.redis_password_file:
        password = read_password_file(config.redis_password_file)
    if urlsplit(config.redis_url).password:
        log.warning(
            "the Redis URL carries a password, which shows in `ps` and wherever the URL is "
            "configured: put it in a file (--redis-password-file) or TESSERA_REDIS_PASSWORD"
        )
    return RedisConnection(
        config.redis_url,
        config.redis_cluster,
        config.redis_username,
        password,
        config.redis_tls_ca_file,
        config.redis_tls_cert_file,
        config.redis_tls_key_file,
    )


def read_password_file(path: str) -> str:
    """The file's text without its line ending (as `echo` or an editor leaves it)."""
    try:
        password = Path(path).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as error:
        raise RedisSettingsError(f"cannot read the Redis password file {path}: {error}") from None
    if not password:
        raise RedisSettingsError(f"the Redis password file {path} is empty")
    return password


def make_client(
    connection: RedisConnection, timeout_seconds: float, max_connections: int
) -> aioredis.Redis | RedisCluster:
    """A lazily connecting client: nothing touches the network until the first command."""
    options: dict[str, Any] = {
        "socket_timeout": timeout_seconds,
        "socket_connect_timeout": timeout_seconds,
        "max_connections": max_connections,
        "retry": Retry(ExponentialBackoff(cap=0.1, base=0.01), CLIENT_RETRIES),
        **connection.client_options(),
    }
    if connection.cluster:
        return RedisCluster.from_url(connection.url, **options)
    return aioredis.from_url(connection.url, **options)
