"""A throwaway certificate authority and one certificate per role, for `tessera serve
--tls auto` and for tests. Production certificates come from the operator's own CA (e.g.
cert-manager); this module only makes local ones.

    files = write_role_certificates(Path("/tmp/certs"))
    files["gateway"]  # TlsFiles(cert_file=".../gateway.pem", key_file=".../gateway.key",
                      #          ca_file=".../ca.pem")

A role's name is its certificate's common name (CN): that is what the services'
`--allow-callers` rules match (tessera.access).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tessera.tls import TlsFiles

ROLES = ("gateway", "decoder", "encoder", "client")
# Loopback by name and by address: gRPC checks the address a channel dials (an IP on
# loopback) against the certificate's IP SANs, and a name against its DNS SANs.
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Kubernetes service names of deploy/k8s, so the same certificates also fit a cluster.
SERVICE_HOSTS = ("tessera-gateway", "tessera-encoder", "tessera-decoder")
_VALID_DAYS = 30
# Every service is a server and a client of the others.
_BOTH_SIDES = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


@dataclass(frozen=True)
class Authority:
    """A CA: its certificate (PEM) and its signing key."""

    cert_pem: bytes
    key: ec.EllipticCurvePrivateKey

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class Issued:
    """A certificate (PEM) and its private key (PEM, unencrypted)."""

    cert_pem: bytes
    key_pem: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder, days: int) -> x509.CertificateBuilder:
    # A minute back: a peer whose clock is slightly behind still accepts it at once.
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
    return builder.not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))


def new_authority(common_name: str = "tessera local CA", days: int = _VALID_DAYS) -> Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
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
    )
    certificate = _validity(builder, days).sign(key, hashes.SHA256())
    return Authority(certificate.public_bytes(serialization.Encoding.PEM), key)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def issue(
    authority: Authority,
    common_name: str,
    hosts: Sequence[str] = (*LOCAL_HOSTS, *SERVICE_HOSTS),
    days: int = _VALID_DAYS,
) -> Issued:
    """A certificate for `common_name` (the role), good both as a server's (for `hosts`)
    and as a client's: every service is both. Each call has a new key and serial."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(_BOTH_SIDES),
            critical=False,
        )
    )
    certificate = _validity(builder, days).sign(authority.key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return Issued(certificate.public_bytes(serialization.Encoding.PEM), key_pem)


def write_atomically(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replaces `path` by a rename, as Kubernetes updates a mounted secret: a reader sees
    the old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def install(issued: Issued, files: TlsFiles) -> None:
    """Writes a certificate and its key over `files` (the key first: a reader that sees
    the new certificate beside the old key skips the pair until both are new)."""
    assert files.cert_file and files.key_file
    write_atomically(Path(files.key_file), issued.key_pem, 0o600)
    write_atomically(Path(files.cert_file), issued.cert_pem)


def write_role_certificates(
    directory: Path,
    roles: Sequence[str] = ROLES,
    authority: Authority | None = None,
    extra_hosts: Sequence[str] = (),
) -> dict[str, TlsFiles]:
    """A new CA (unless one is given) in `directory`/ca.pem and, per role, `role`.pem and
    `role`.key signed by it, valid for loopback, the Kubernetes service names and
    `extra_hosts`. Returns each role's TlsFiles."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = authority or new_authority()
    ca_file = directory / "ca.pem"
    write_atomically(ca_file, authority.cert_pem)
    files: dict[str, TlsFiles] = {}
    for role in roles:
        role_files = TlsFiles(
            str(directory / f"{role}.pem"), str(directory / f"{role}.key"), str(ca_file)
        )
        hosts = [*LOCAL_HOSTS, *SERVICE_HOSTS, *extra_hosts]
        install(issue(authority, role, list(dict.fromkeys(hosts))), role_files)
        files[role] = role_files
    return files
