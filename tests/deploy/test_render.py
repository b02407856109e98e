"""Every overlay renders with `kubectl kustomize`, and every object it renders is valid
for Kubernetes (strict schema: unknown fields are errors, not ignored). cert-manager's
kinds, whose CRDs kubernetes-validate does not ship, are checked against strict schemas
of their own (tests/deploy/cert_manager.py)."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy import cert_manager
from tests.deploy.conftest import TARGETS
from tests.deploy.k8s import Rendered

# The oldest release the manifests target (native preStop `sleep` is on by default from
# 1.30) and the newest whose schemas the pinned kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())

EXPECTED_KINDS = {
    "Namespace",
    "ConfigMap",
    "Deployment",
    "StatefulSet",
    "Service",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "NetworkPolicy",
}


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_in_strict_mode(rendered: Rendered, version: str):
    problems = []
    for obj in rendered.objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if cert_manager.is_cert_manager(obj):
            try:
                cert_manager.validate(obj)
            except jsonschema.ValidationError as error:
                path = ".".join(str(p) for p in error.path)
                problems.append(f"{where}: {path}: {error.message} (cert-manager schema)")
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            problems.append(f"{where}: {path}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            problems.append(f"{where}: {error.message}")
    assert not problems, f"{rendered.name} against Kubernetes {version}:\n" + "\n".join(problems)


def test_renders_the_whole_system(rendered: Rendered):
    assert set(rendered.by_kind) >= EXPECTED_KINDS, rendered.name
    names = {o["metadata"]["name"] for o in rendered.kind("Deployment")}
    assert names == {"tessera-gateway", "tessera-encoder", "tessera-decoder"}
    namespaces = {
        o["metadata"].get("namespace") for o in rendered.objects if o["kind"] != "Namespace"
    }
    assert namespaces == {"tessera"}, "every namespaced object goes to one namespace"


def test_the_validator_catches_a_broken_object(renders):
    """The strict check is live: an unknown field and a wrong type are both refused."""
    deployment = renders[TARGETS[0]].workload("encoder")
    broken = {**deployment, "spec": {**deployment["spec"], "replicaz": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_cert_manager_schemas_catch_a_broken_object(renders):
    """The cert-manager check is live too: a misspelt field and an unknown usage fail."""
    (certificate, *_) = renders["cpu-dev+mtls"].kind("Certificate")
    cert_manager.validate(certificate)
    spec = certificate["spec"]
    for broken in ({**spec, "dnsName": ["x"]}, {**spec, "usages": ["server-auth"]}):
        with pytest.raises(jsonschema.ValidationError):
            cert_manager.validate({**certificate, "spec": broken})
