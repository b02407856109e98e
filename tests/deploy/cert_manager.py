"""Strict schemas for the cert-manager objects deploy/k8s renders (cert-manager.io/v1
Issuer and Certificate), which kubernetes-validate does not ship: the fields and enums
of cert-manager's CRDs that these manifests may use, anything else an error, as in the
strict check of built-in kinds. A subset, written from cert-manager's v1 API reference."""

from __future__ import annotations

from typing import Any

import jsonschema

GROUP = "cert-manager.io"
API_VERSION = f"{GROUP}/v1"

# cert-manager's KeyUsage enum.
USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment",
    "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
    "decipher only", "any", "server auth", "client auth", "code signing",
    "email protection", "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user",
    "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
]  # fmt: skip

STRINGS = {"type": "array", "items": {"type": "string"}}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


METADATA = _strict(
    {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
    ("name",),
)
ISSUER_REF = _strict(
    {"name": {"type": "string"}, "kind": {"type": "string"}, "group": {"type": "string"}},
    ("name",),
)
PRIVATE_KEY = _strict(
    {
        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
        "size": {"type": "integer"},
        "encoding": {"enum": ["PKCS1", "PKCS8"]},
        "rotationPolicy": {"enum": ["Never", "Always"]},
    }
)
CERTIFICATE_SPEC = _strict(
    {
        "secretName": {"type": "string"},
        "issuerRef": ISSUER_REF,
        "commonName": {"type": "string", "maxLength": 64},
        "dnsNames": STRINGS,
        "ipAddresses": STRINGS,
        "uris": STRINGS,
        "emailAddresses": STRINGS,
        "isCA": {"type": "boolean"},
        "usages": {"type": "array", "items": {"enum": USAGES}},
        "duration": {"type": "string"},
        "renewBefore": {"type": "string"},
        "privateKey": PRIVATE_KEY,
        "secretTemplate": _strict({"labels": STRING_MAP, "annotations": STRING_MAP}),
        "revisionHistoryLimit": {"type": "integer", "minimum": 1},
    },
    ("secretName", "issuerRef"),
)
ISSUER_SPEC = {
    **_strict(
        {
            "selfSigned": _strict({"crlDistributionPoints": STRINGS}),
            "ca": _strict(
                {
                    "secretName": {"type": "string"},
                    "crlDistributionPoints": STRINGS,
                    "ocspServers": STRINGS,
                    "issuingCertificateURL": STRINGS,
                },
                ("secretName",),
            ),
        }
    ),
    "minProperties": 1,
    "maxProperties": 1,  # exactly one kind of issuer
}


def _object(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _strict(
        {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


SCHEMAS = {
    "Issuer": _object("Issuer", ISSUER_SPEC),
    "Certificate": _object("Certificate", CERTIFICATE_SPEC),
}


def is_cert_manager(obj: dict[str, Any]) -> bool:
    return obj.get("apiVersion", "").split("/")[0] == GROUP


def validate(obj: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError for an object these schemas refuse (and for a
    cert-manager kind they do not cover)."""
    schema = SCHEMAS.get(obj["kind"])
    if schema is None:
        raise jsonschema.ValidationError(f"no schema here for cert-manager kind {obj['kind']}")
    jsonschema.Draft202012Validator(schema).validate(obj)
