"""Throwaway TLS material for the Redis tests: a CA, a server certificate for 127.0.0.1
and localhost, and a client certificate, all signed by the CA; and a stranger's client
certificate signed by another CA. Made by tessera.certs, as `tessera serve --tls auto`
makes its own."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tessera.certs import Issued, issue, new_authority


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: what a server and its clients need."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # Signed by another CA: a server that checks clients must refuse it.
    stranger_cert: Path
    stranger_key: Path


def _write(issued: Issued, cert: Path, key: Path) -> None:
    cert.write_bytes(issued.cert_pem)
    key.write_bytes(issued.key_pem)


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca = new_authority("tessera test CA")
    other_ca = new_authority("someone else's CA")
    files = TlsFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        stranger_cert=directory / "stranger.pem",
        stranger_key=directory / "stranger-key.pem",
    )
    files.ca.write_bytes(ca.cert_pem)
    _write(issue(ca, "redis", ["127.0.0.1", "localhost"]), files.server_cert, files.server_key)
    _write(issue(ca, "tessera-encoder", ["localhost"]), files.client_cert, files.client_key)
    _write(issue(other_ca, "stranger", ["localhost"]), files.stranger_cert, files.stranger_key)
    return files
