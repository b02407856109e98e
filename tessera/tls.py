"""TLS for every gRPC hop: the three files, their flags, credentials for servers and
clients, and rereading the files when they change (certificates rotate without a restart).

One set of flags per process serves both sides of it: a service presents `--tls-cert-file`
as its server certificate and as its client certificate when it calls other services,
and trusts `--tls-ca-file` for both.

    no flags              plaintext (the default; every caller is unauthenticated)
    cert + key            the server speaks TLS; clients use the system's roots
    cert + key + CA       mutual TLS: the server requires a client certificate from the CA,
                          clients verify servers against the CA
    CA alone              (clients only) verify the server, present no certificate
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from tessera.config_common import env_default

log = logging.getLogger("tessera.tls")

# Server-name override (`grpc.ssl_target_name_override`): the name a server's certificate
# is checked against instead of the dialed address. Used for addresses resolved from a
# `dns:///name:port` target (checked against `name`, as gRPC's own DNS resolver would).
SERVER_NAME_OPTION = "grpc.ssl_target_name_override"


class TlsFilesError(ValueError):
    """TLS files that cannot be used: missing, unreadable, or not fitting together."""


@dataclass(frozen=True)
class TlsFiles:
    """Paths of a PEM certificate (chain), its unencrypted key, and the CA bundle that
    peers' certificates must chain to. All None: plaintext."""

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("--tls-cert-file and --tls-key-file go together")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file or self.ca_file)

    @property
    def mutual(self) -> bool:
        """Serving with this requires and verifies client certificates."""
        return bool(self.cert_file and self.ca_file)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.ca_file) if p)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TlsFiles:
        try:
            return cls(args.tls_cert_file, args.tls_key_file, args.tls_ca_file)
        except ValueError as error:
            raise SystemExit(str(error)) from None


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    for name, what in [
        ("cert", "PEM certificate (chain) this process presents, as server and as client"),
        ("key", "PEM private key of --tls-cert-file (unencrypted)"),
        ("ca", "PEM CA bundle peers' certificates must chain to; on a server it makes "
         "client certificates required (mutual TLS)"),
    ]:  # fmt: skip
        env = f"TESSERA_TLS_{name.upper()}_FILE"
        parser.add_argument(
            f"--tls-{name}-file",
            default=env_default(env, None),
            help=f"{what}; reread when it changes (env {env}; default: plaintext)",
        )


@dataclass(frozen=True)
class TlsMaterial:
    """The files' bytes as read together."""

    cert: bytes | None
    key: bytes | None
    ca: bytes | None

    def describe(self) -> str:
        """`CN=encoder serial=1f2e...` of the certificate, for logs."""
        if self.cert is None:
            return "no certificate"
        from cryptography import x509

        certificate = x509.load_pem_x509_certificate(self.cert)
        return f"{certificate.subject.rfc4514_string()} serial={certificate.serial_number:x}"


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as file:
        return file.read()


def read_material(files: TlsFiles) -> TlsMaterial:
    """The three files, checked to fit: the key must be the certificate's. Raises
    ValueError (or OSError) otherwise, e.g. while a rotation has replaced one of the pair
    and not yet the other."""
    material = TlsMaterial(_read(files.cert_file), _read(files.key_file), _read(files.ca_file))
    if material.cert is not None and material.key is not None:
        _check_pair(material.cert, material.key)
    if material.ca is not None:
        from cryptography import x509

        x509.load_pem_x509_certificates(material.ca)  # raises ValueError if not PEM
    return material


def _check_pair(cert_pem: bytes, key_pem: bytes) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    public = x509.load_pem_x509_certificate(cert_pem).public_key()
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise ValueError("the TLS key is encrypted; give an unencrypted key") from None
    encoding, form = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if public.public_bytes(encoding, form) != key.public_key().public_bytes(encoding, form):
        raise ValueError("the TLS key does not belong to the certificate")


def _stamp(paths: Sequence[str]) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is rewritten or replaced: a rename (how Kubernetes and
    cert-manager update mounted secrets) gives a new inode even within one mtime tick."""
    stamps = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            stamps.append((0, 0, 0))
            continue
        stamps.append((info.st_ino, info.st_mtime_ns, info.st_size))
    return tuple(stamps)


class TlsWatch:
    """The files' current material: `refresh()` rereads them when any changed on disk,
    and keeps the last good material while they do not fit (a rotation half done).

    Thread-safe: gRPC calls a server's fetcher from its own threads.
    """

    def __init__(self, files: TlsFiles):
        self.files = files
        self._lock = threading.Lock()
        self._stamp = _stamp(files.paths)
        try:
            self.material = read_material(files)
        except (OSError, ValueError) as error:
            paths = ", ".join(files.paths)
            raise TlsFilesError(f"cannot use the TLS files {paths}: {error}") from None

    def refresh(self) -> TlsMaterial | None:
        """The new material if the files changed (and fit), else None."""
        with self._lock:
            stamp = _stamp(self.files.paths)
            if stamp == self._stamp:
                return None
            try:
                material = read_material(self.files)
            except (OSError, ValueError) as error:
                log.warning("TLS files changed but cannot be used yet (kept the old): %s", error)
                return None
            self._stamp = stamp
            if material == self.material:
                return None
            self.material = material
            log.info("TLS files reloaded: %s", material.describe())
            return material


def _server_config(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(material.key, material.cert)], material.ca)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """TLS credentials that pick up new files without a restart: gRPC calls the fetcher
    before every new connection's handshake, and it rereads the files only when their
    stamps changed. Connections already open keep the certificate they began with."""
    if not files.cert_file:
        raise TlsFilesError("a TLS server needs --tls-cert-file and --tls-key-file")
    watch = TlsWatch(files)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        material = watch.refresh()
        return None if material is None else _server_config(material)

    return grpc.dynamic_ssl_server_credentials(
        _server_config(watch.material), fetch, require_client_authentication=files.mutual
    )


def channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    """Verify servers against the CA (the system's roots without one); present the
    certificate, if any, as this client's."""
    return grpc.ssl_channel_credentials(material.ca, material.key, material.cert)


def channel_options(server_name: str | None) -> list[tuple[str, str]]:
    return [(SERVER_NAME_OPTION, server_name)] if server_name else []


def sync_channel(
    address: str, tls: TlsFiles | None, options: Sequence[tuple[str, object]] = ()
) -> grpc.Channel:
    """A blocking channel: plaintext, or TLS with the files as read now."""
    if tls is None or not tls.enabled:
        return grpc.insecure_channel(address, options=list(options))
    credentials = channel_credentials(TlsWatch(tls).material)
    return grpc.secure_channel(address, credentials, options=list(options))


def aio_channel(
    address: str, tls: TlsFiles | None, options: Sequence[tuple[str, object]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel: plaintext, or TLS with the files as read now."""
    if tls is None or not tls.enabled:
        return grpc.aio.insecure_channel(address, options=list(options))
    credentials = channel_credentials(TlsWatch(tls).material)
    return grpc.aio.secure_channel(address, credentials, options=list(options))


def tls_args(files: TlsFiles) -> list[str]:
    """The flags that give a process `files`.

    `TlsFiles("c.pem", "c.key", "ca.pem")` ->
    `["--tls-cert-file", "c.pem", "--tls-key-file", "c.key", "--tls-ca-file", "ca.pem"]`
    """
    pairs = [("--tls-cert-file", files.cert_file), ("--tls-key-file", files.key_file)]
    pairs.append(("--tls-ca-file", files.ca_file))
    return [part for flag, path in pairs if path for part in (flag, path)]
