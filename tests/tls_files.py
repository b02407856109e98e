"""Throwaway TLS material for tests: a CA, a server certificate for 127.0.0.1 and
localhost, and a client certificate, all signed by the CA; and a stranger's client
certificate signed by another CA. EC P-256 keys: fast to make."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


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


@dataclass(frozen=True)
class _Issuer:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey


def make_tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca("tessera test CA", directory / "ca.pem")
    other_ca = _make_ca("someone else's CA", directory / "other-ca.pem")
    server = x509.SubjectAlternativeName(
        [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    )
    _make_leaf(ca, "redis", server, ExtendedKeyUsageOID.SERVER_AUTH, directory / "server")
    _make_leaf(ca, "tessera-encoder", None, ExtendedKeyUsageOID.CLIENT_AUTH, directory / "client")
    _make_leaf(other_ca, "stranger", None, ExtendedKeyUsageOID.CLIENT_AUTH, directory / "stranger")
    return TlsFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        stranger_cert=directory / "stranger.pem",
        stranger_key=directory / "stranger-key.pem",
    )


def _make_ca(common_name: str, path: Path) -> _Issuer:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return _Issuer(name, key)


def _make_leaf(
    issuer: _Issuer,
    common_name: str,
    names: x509.SubjectAlternativeName | None,
    usage: x509.ObjectIdentifier,
    stem: Path,
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = _builder(subject, issuer.name, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage]), critical=False
    )
    if names is not None:
        builder = builder.add_extension(names, critical=False)
    cert = builder.sign(issuer.key, hashes.SHA256())
    stem.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    Path(f"{stem}-key.pem").write_bytes(key_pem)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
    )
