"""Rendering the kustomize overlays and reading the result the way Kubernetes would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = {"cpu-dev": K8S / "overlays" / "cpu-dev", "gpu": K8S / "overlays" / "gpu"}
# Compositions a user makes from the base and the components (see deploy/README.md);
# rendered from a temporary kustomization so the repo holds no test-only overlays.
VARIANTS = {
    "base+model-download": ["model-download"],
    "base+model-pvc+encoders-on-gpu": ["model-pvc", "encoders-on-gpu"],
    "cpu-dev+mtls": ["mtls"],
}
# What a variant builds on: the base unless it is named after an overlay ("cpu-dev+...").
VARIANT_BASES = {"cpu-dev+mtls": OVERLAYS["cpu-dev"]}
SERVICES = ("gateway", "encoder", "decoder")
TESSERA_IMAGE_NAMES = ("tessera", "registry.example.com/tessera")

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH: the deploy tests render deploy/k8s with "
            "`kubectl kustomize` (kubectl >= 1.27 bundles kustomize). Install kubectl, "
            "e.g. https://kubernetes.io/docs/tasks/tools/, and run the tests again.",
            pytrace=False,
        )
    return path


def kustomize(directory: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        pytest.fail(f"kubectl kustomize {directory} failed:\n{result.stderr}", pytrace=False)
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


def variant_dir(name: str, parent: Path) -> Path:
    """A kustomization of the base (or the variant's overlay) plus the variant's
    components, under `parent`."""
    directory = parent / name.replace("+", "_")
    directory.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(VARIANT_BASES.get(name, K8S / "base"), directory)
    components = [os.path.relpath(K8S / "components" / c, directory) for c in VARIANTS[name]]
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "tessera",
                "resources": [base],
                "components": components,
            }
        )
    )
    return directory


@dataclass
class Rendered:
    """The objects of one rendered overlay, with lookups."""

    name: str
    objects: list[Obj]
    by_kind: dict[str, list[Obj]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for obj in self.objects:
            self.by_kind.setdefault(obj["kind"], []).append(obj)

    def kind(self, kind: str) -> list[Obj]:
        return self.by_kind.get(kind, [])

    def get(self, kind: str, name: str) -> Obj:
        for obj in self.kind(kind):
            if obj["metadata"]["name"] == name:
                return obj
        raise KeyError(f"{self.name}: no {kind} named {name}")

    def workloads(self) -> list[Obj]:
        return self.kind("Deployment") + self.kind("StatefulSet")

    def workload(self, service: str) -> Obj:
        return self.get("Deployment", f"tessera-{service}")

    def configmap(self, name: str) -> dict[str, str]:
        return self.get("ConfigMap", name).get("data", {})


def pod_spec(workload: Obj) -> Obj:
    return workload["spec"]["template"]["spec"]


def all_containers(workload: Obj) -> Iterator[Obj]:
    spec = pod_spec(workload)
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def main_container(workload: Obj) -> Obj:
    (container,) = pod_spec(workload)["containers"]
    return container


def is_tessera_image(image: str) -> bool:
    return image.rsplit(":", 1)[0] in TESSERA_IMAGE_NAMES


# --- the environment and the arguments a container gets ---------------------------------

FIELD_VALUES = {"metadata.name": "tessera-pod-0", "metadata.namespace": "tessera"}


def cpu_cores(quantity: str) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def resource_field(container: Obj, ref: Obj) -> str:
    kind, _, resource = ref["resource"].partition(".")
    value = container.get("resources", {}).get(kind, {}).get(resource)
    assert value is not None, f"{container['name']}: resourceFieldRef to unset {ref['resource']}"
    assert resource == "cpu", "only cpu resourceFieldRefs are modelled here"
    divisor = cpu_cores(ref.get("divisor", "1"))
    # Kubernetes rounds up to a whole multiple of the divisor.
    return str(int(-(-cpu_cores(value) // divisor)))


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, `$$` is a literal `$`,
    anything else stays as written."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


def container_env(rendered: Rendered, container: Obj) -> dict[str, str]:
    """The container's environment as the kubelet builds it (ConfigMap keys resolved,
    downward-API fields given stand-in values, secrets marked)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        assert ref, f"{container['name']}: only configMapRef envFrom is modelled"
        for key, value in rendered.configmap(ref["name"]).items():
            env[source.get("prefix", "") + key] = value
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand(item["value"], env)
            continue
        ref = item["valueFrom"]
        if "configMapKeyRef" in ref:
            key_ref = ref["configMapKeyRef"]
            data = rendered.configmap(key_ref["name"])
            assert key_ref["key"] in data or key_ref.get("optional"), (
                f"{rendered.name}: {container['name']} reads {key_ref['key']}, which "
                f"ConfigMap {key_ref['name']} does not have"
            )
            if key_ref["key"] in data:
                env[name] = data[key_ref["key"]]
        elif "secretKeyRef" in ref:
            env[name] = "<secret>"
        elif "fieldRef" in ref:
            env[name] = FIELD_VALUES[ref["fieldRef"]["fieldPath"]]
        elif "resourceFieldRef" in ref:
            env[name] = resource_field(container, ref["resourceFieldRef"])
        else:
            raise AssertionError(f"{container['name']}: unknown env source {ref}")
    return env


def container_args(rendered: Rendered, container: Obj) -> list[str]:
    env = container_env(rendered, container)
    args = [expand(a, env) for a in container.get("args", [])]
    unresolved = [a for a in args if re.search(r"\$\([A-Za-z_]", a)]
    assert not unresolved, (
        f"{rendered.name}: {container['name']} passes {unresolved} with no such variable "
        "defined: the process would get the text literally"
    )
    return args


def flag_value(args: list[str], flag: str) -> str | None:
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def without_flag(args: list[str], flag: str) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return out


# --- quantities ----------------------------------------------------------------------------

BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def memory_bytes(quantity: str | int) -> int:
    text = str(quantity)
    for suffix, factor in {**BINARY, **DECIMAL}.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def redis_bytes(value: str) -> int:
    """redis.conf memory units: 1k = 1000, 1kb = 1024, and so on."""
    match = re.fullmatch(r"(\d+)([a-z]*)", value.strip().lower())
    assert match, f"not a redis memory size: {value!r}"
    number, unit = int(match.group(1)), match.group(2)
    factors = {"": 1, "k": 10**3, "kb": 2**10, "m": 10**6, "mb": 2**20, "g": 10**9, "gb": 2**30}
    return number * factors[unit]


# --- NetworkPolicy reachability ---------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: tuple[tuple[str, str], ...]

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    assert "matchExpressions" not in (selector or {}), "only matchLabels is modelled"
    return all(labels.get(k) == v for k, v in (selector or {}).get("matchLabels", {}).items())


def peer_matches(peer: Obj, pod: Pod, policy_namespace: str) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers are not modelled"
    if "namespaceSelector" in peer:
        # Namespaces are modelled by name only: {} selects every namespace.
        namespace_ok = not peer["namespaceSelector"] or selects(
            peer["namespaceSelector"], {"kubernetes.io/metadata.name": pod.namespace}
        )
    else:
        namespace_ok = pod.namespace == policy_namespace
    return namespace_ok and selects(peer.get("podSelector"), pod.label_dict)


def port_matches(rule_ports: list[Obj] | None, port: int, protocol: str) -> bool:
    if not rule_ports:
        return True
    return any(
        p.get("protocol", "TCP") == protocol and ("port" not in p or p["port"] == port)
        for p in rule_ports
    )


def policy_types(policy: Obj) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))


def direction_allows(
    policies: list[Obj], subject: Pod, other: Pod, port: int, protocol: str, direction: str
) -> bool:
    """Whether `subject`'s policies of `direction` ("Ingress"/"Egress") let traffic with
    `other` on `port` through. No policy of that direction selecting it: allowed."""
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    relevant = [
        p
        for p in policies
        if p["metadata"].get("namespace") == subject.namespace
        and direction in policy_types(p)
        and selects(p["spec"]["podSelector"], subject.label_dict)
    ]
    if not relevant:
        return True
    for policy in relevant:
        for rule in policy["spec"].get(key, []):
            peers = rule.get(peers_key)
            peer_ok = not peers or any(
                peer_matches(peer, other, policy["metadata"]["namespace"]) for peer in peers
            )
            if peer_ok and port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def reachable(policies: list[Obj], src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
    return direction_allows(policies, src, dst, port, protocol, "Egress") and direction_allows(
        policies, dst, src, port, protocol, "Ingress"
    )
