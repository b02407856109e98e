"""The rendered manifests keep the promises of deploy/README.md: probes that reach the
real gRPC port, GPUs where the device is cuda, locked-down pods, enough time to drain,
budgets and network policies, headless discovery, and container arguments the services'
own parsers accept."""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.k8s import (
    K8S,
    ROOT,
    SERVICES,
    Obj,
    Pod,
    Rendered,
    all_containers,
    container_args,
    container_env,
    flag_value,
    is_tessera_image,
    main_container,
    memory_bytes,
    pod_spec,
    reachable,
    redis_bytes,
    without_flag,
)

GRPC_PORTS = {"gateway": 50051, "encoder": 50052, "decoder": 50053}
METRICS_FLAG = "--metrics-port"
# Where each service serves Prometheus /metrics: its own port, off the ports clients reach.
METRICS_PORT_FLAGS = {"encoder": METRICS_FLAG, "decoder": METRICS_FLAG, "gateway": METRICS_FLAG}
GPU = "nvidia.com/gpu"
HEALTH_PORT = 8081  # components/mtls: the plaintext health-only port the probes check


# --- the services' own argument parsers -----------------------------------------------------


def service_parts(service: str) -> tuple[Callable[[], argparse.ArgumentParser], type]:
    if service == "encoder":
        from encoder_service.config import EncoderConfig
        from encoder_service.main import build_parser

        return build_parser, EncoderConfig
    if service == "decoder":
        from decoder_service.config import DecoderConfig
        from decoder_service.main import build_parser

        return build_parser, DecoderConfig
    from gateway.config import GatewayConfig
    from gateway.main import build_parser

    return build_parser, GatewayConfig


@contextlib.contextmanager
def container_environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ as in the container (for the parsers' TESSERA_* defaults)."""
    saved = dict(os.environ)
    try:
        for name in [n for n in os.environ if n.startswith("TESSERA_")]:
            del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse_or_fail(parser: argparse.ArgumentParser, args: list[str], where: str):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{where}: the parser refuses {args}:\n{stderr.getvalue()}", pytrace=False)


def build_parser_in(env: dict[str, str], service: str) -> argparse.ArgumentParser:
    build, _ = service_parts(service)
    with container_environment(env):
        return build()


def parsed_service(rendered: Rendered, service: str) -> argparse.Namespace:
    """The Namespace the service's real parser makes of the container's arguments (with
    --metrics-port left out while a service does not have that flag yet: see
    test_prometheus_scrapes_the_port_the_service_serves_metrics_on)."""
    container = main_container(rendered.workload(service))
    env = container_env(rendered, container)
    args = container_args(rendered, container)
    assert args[0] == service, f"{rendered.name}: tessera-{service} runs `tessera {args[0]}`"
    parser = build_parser_in(env, service)
    rest = args[1:]
    if METRICS_FLAG not in parser._option_string_actions:
        rest = without_flag(rest, METRICS_FLAG)
    with container_environment(env):
        return parse_or_fail(parser, rest, f"{rendered.name}: tessera-{service}")


def test_every_tessera_container_runs_the_tessera_entrypoint(rendered: Rendered):
    for workload in rendered.workloads():
        for container in all_containers(workload):
            if not is_tessera_image(container["image"]):
                continue
            where = f"{rendered.name}: {workload['metadata']['name']}/{container['name']}"
            command = container.get("command")
            if command is None:
                continue  # the image's ENTRYPOINT, `tessera`
            # The one other program the image provides for init steps.
            assert command == ["hf"], f"{where}: unexpected command {command}"
            assert container["args"][0] == "download", where


@pytest.mark.parametrize("service", SERVICES)
def test_service_args_are_accepted_by_the_real_parser(rendered: Rendered, service: str):
    """Each service's arguments, with env and ConfigMap values substituted as the kubelet
    does, parse with `tessera <service>`'s parser and pass its config checks."""
    args = parsed_service(rendered, service)
    _, config_class = service_parts(service)
    try:
        config = config_class.from_args(args)
    except SystemExit as error:
        pytest.fail(f"{rendered.name}: tessera-{service}: {error}", pytrace=False)
    assert config.host == "0.0.0.0", "listen on the pod IP, not loopback"
    assert config.port == GRPC_PORTS[service]


def test_init_container_args_are_accepted_by_the_tessera_cli(rendered: Rendered):
    from tessera.cli import build_parser

    for workload in rendered.workloads():
        for container in pod_spec(workload).get("initContainers", []):
            if not is_tessera_image(container["image"]) or "command" in container:
                continue
            args = container_args(rendered, container)
            with container_environment(container_env(rendered, container)):
                parse_or_fail(build_parser(), args, f"{rendered.name}: {container['name']}")


@pytest.mark.parametrize("service", SERVICES)
def test_prometheus_scrapes_the_port_the_service_serves_metrics_on(rendered: Rendered, service):
    """Encoders and decoders serve /metrics on --metrics-port, the gateway on its HTTP API
    port. A service that does not have the flag yet skips only this check (the other
    argument checks run without that one flag)."""
    container = main_container(rendered.workload(service))
    env = container_env(rendered, container)
    args = container_args(rendered, container)
    flag = METRICS_PORT_FLAGS[service]
    assert flag_value(args, flag), f"{rendered.name}: tessera-{service} passes no {flag}"
    parser = build_parser_in(env, service)
    if flag not in parser._option_string_actions:
        pytest.skip(
            f"`tessera {service}` has no {flag} flag yet, which the manifests pass for "
            f"Prometheus; this check passes once the flag exists"
        )
    with container_environment(env):
        parsed = parse_or_fail(parser, args[1:], f"{rendered.name}: tessera-{service}")
    port = getattr(parsed, flag.removeprefix("--").replace("-", "_"))
    annotations = rendered.workload(service)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"
    assert port == int(annotations["prometheus.io/port"])
    assert port in [p["containerPort"] for p in container["ports"]]


# --- probes, ports and services --------------------------------------------------------------


def probed_port(rendered: Rendered, service: str) -> int:
    """Where the kubelet's grpc probes must go: the plaintext --health-port if the service
    has one, else its gRPC port. Under mutual TLS it must have one: the kubelet presents
    no client certificate, so a probe of the main port fails the handshake."""
    parsed = parsed_service(rendered, service)
    if parsed.tls_cert_file and parsed.tls_ca_file:
        assert parsed.health_port, f"{rendered.name}: tessera-{service}: mTLS, no --health-port"
    return parsed.health_port or parsed.port


@pytest.mark.parametrize("service", SERVICES)
def test_grpc_probes_use_the_numeric_port_the_service_listens_on(rendered: Rendered, service):
    container = main_container(rendered.workload(service))
    parsed = parsed_service(rendered, service)
    port = probed_port(rendered, service)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == parsed.port
    if parsed.health_port:
        assert ports["health"] == parsed.health_port
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        assert probe, f"{rendered.name}: tessera-{service} has no {kind}"
        assert "grpc" in probe, f"{kind} must check grpc.health.v1, not a TCP connect"
        probe_port = probe["grpc"]["port"]
        assert isinstance(probe_port, int) and not isinstance(probe_port, bool), (
            f"{rendered.name}: tessera-{service} {kind} port {probe_port!r}: the grpc "
            "probe takes a number, never a port name"
        )
        assert probe_port == port, (
            f"{kind} checks {probe_port}, the service serves health on {port}"
        )
        assert "service" not in probe["grpc"], "the overall health (empty service name)"


def service_target_port(service: Obj, port: Obj, container: Obj) -> int:
    target = port.get("targetPort", port["port"])
    if isinstance(target, int):
        return target
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == target]
    return number


@pytest.mark.parametrize("service", SERVICES)
def test_services_select_the_pods_and_reach_their_grpc_port(rendered: Rendered, service: str):
    workload = rendered.workload(service)
    svc = rendered.get("Service", f"tessera-{service}")
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (grpc,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc["port"] == GRPC_PORTS[service]
    assert service_target_port(svc, grpc, main_container(workload)) == GRPC_PORTS[service]
    headless = svc["spec"].get("clusterIP") == "None"
    if service == "gateway":
        assert not headless and svc["spec"].get("type", "ClusterIP") == "ClusterIP"
    else:
        # The gateway must see every replica through DNS, not one virtual IP.
        assert headless, f"{rendered.name}: the {service} Service must be headless"
        assert not svc["spec"].get("publishNotReadyAddresses", False)


@pytest.mark.parametrize(
    ("caller", "flag", "service"),
    [
        ("gateway", "encoders", "encoder"),
        ("gateway", "decoders", "decoder"),
        # The decoder dials only the encoders it discovers itself, never one a request names.
        ("decoder", "encoders", "encoder"),
    ],
)
def test_callers_discover_replicas_through_the_headless_services(rendered, caller, flag, service):
    (target,) = getattr(parsed_service(rendered, caller), flag)
    assert target.startswith("dns:///"), f"{caller} --{flag} must resolve every replica: {target}"
    name, port = target.removeprefix("dns:///").rsplit(":", 1)
    svc = rendered.get("Service", name)
    assert svc["spec"]["clusterIP"] == "None"
    assert int(port) in [p["port"] for p in svc["spec"]["ports"]]
    assert int(port) == parsed_service(rendered, service).port


def test_encoders_share_the_redis_service(rendered: Rendered):
    url = parsed_service(rendered, "encoder").redis_url
    assert url, "encoders run with --redis-url"
    parts = urlsplit(url)
    assert parts.username is None and parts.password is None, (
        f"{rendered.name}: credentials in the Redis URL ({url}) show in ConfigMaps and `ps`"
    )
    host, port = parts.hostname, parts.port
    svc = rendered.get("Service", host)
    redis = rendered.get("StatefulSet", "tessera-redis")
    assert (
        svc["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    )
    assert int(port) in [p["port"] for p in svc["spec"]["ports"]]


# --- security -------------------------------------------------------------------------------


def test_every_container_is_non_root_read_only_and_unprivileged(rendered: Rendered):
    for workload in rendered.workloads():
        spec = pod_spec(workload)
        pod = spec.get("securityContext", {})
        name = workload["metadata"]["name"]
        assert spec.get("automountServiceAccountToken") is False, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        assert pod.get("runAsUser", 1) != 0 and pod.get("runAsGroup", 1) != 0, name
        for container in all_containers(workload):
            where = f"{rendered.name}: {name}/{container['name']}"
            own = container.get("securityContext", {})

            def effective(key, own=own, pod=pod):
                return own.get(key, pod.get(key))

            assert effective("runAsNonRoot") is True, f"{where}: runAsNonRoot"
            assert effective("runAsUser") not in (0, None), f"{where}: a numeric non-root uid"
            assert own.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
            assert own.get("allowPrivilegeEscalation") is False, f"{where}: privilege escalation"
            assert not own.get("privileged"), where
            assert own.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: drop ALL"
            assert not own.get("capabilities", {}).get("add"), where
            seccomp = effective("seccompProfile") or {}
            assert seccomp.get("type") == "RuntimeDefault", f"{where}: seccompProfile"


def test_writable_paths_are_empty_dirs(rendered: Rendered):
    """With a read-only root, what torch, Hugging Face and Python write goes to /tmp,
    /cache (HF_HOME, TESSERA_HOME in the image) and /dev/shm: all emptyDir."""
    for workload in rendered.workloads():
        volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
        for container in all_containers(workload):
            if not is_tessera_image(container["image"]):
                continue
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            where = f"{rendered.name}: {workload['metadata']['name']}/{container['name']}"
            needed = ["/tmp", "/cache"]
            if container in pod_spec(workload)["containers"]:
                needed.append("/dev/shm")
            for path in needed:
                assert path in mounts, f"{where}: nothing writable mounted at {path}"
                assert "emptyDir" in volumes[mounts[path]], f"{where}: {path}"
            if "/dev/shm" in needed:
                shm = volumes[mounts["/dev/shm"]]
                assert shm["emptyDir"].get("medium") == "Memory", f"{where}: /dev/shm in RAM"
                assert shm["emptyDir"].get("sizeLimit"), f"{where}: bound /dev/shm"


def test_pods_do_not_get_service_links(rendered: Rendered):
    """A Service named tessera-encoder would put TESSERA_ENCODER_PORT=tcp://... in every
    pod's environment, beside the TESSERA_* variables the services read."""
    for workload in rendered.workloads():
        assert pod_spec(workload).get("enableServiceLinks") is False, workload["metadata"]


# --- shutdown -------------------------------------------------------------------------------


def pre_stop_seconds(container: Obj) -> float:
    handler = container.get("lifecycle", {}).get("preStop")
    assert handler, f"{container['name']}: no preStop hook"
    if "sleep" in handler:
        return float(handler["sleep"]["seconds"])
    command = handler["exec"]["command"]
    assert command[0] in ("sleep", "/bin/sleep"), command
    return float(command[1])


@pytest.mark.parametrize("service", SERVICES)
def test_grace_period_covers_pre_stop_and_drain(rendered: Rendered, service: str):
    workload = rendered.workload(service)
    container = main_container(workload)
    drain = parsed_service(rendered, service).drain_seconds
    sleep = pre_stop_seconds(container)
    grace = pod_spec(workload).get("terminationGracePeriodSeconds", 30)
    assert sleep >= 5, "the preStop sleep lets endpoints and the gateway's DNS catch up"
    assert grace >= sleep + drain, (
        f"{rendered.name}: tessera-{service}: terminationGracePeriodSeconds {grace} < "
        f"preStop {sleep} + --drain-seconds {drain}: requests would be cut off"
    )
    liveness = container["livenessProbe"]
    patience = liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3)
    assert patience > drain, "liveness must not kill a pod that is draining (NOT_SERVING)"


# --- resources and devices ------------------------------------------------------------------


def test_every_container_has_requests_and_limits(rendered: Rendered):
    for workload in rendered.workloads():
        for container in all_containers(workload):
            where = f"{rendered.name}: {workload['metadata']['name']}/{container['name']}"
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    assert resource in resources.get(kind, {}), f"{where}: {kind}.{resource}"
            assert memory_bytes(resources["requests"]["memory"]) <= memory_bytes(
                resources["limits"]["memory"]
            ), where


def test_devices_match_gpu_limits(rendered: Rendered):
    """A service on cuda has a GPU in its limits (and lands on GPU nodes); a CPU one has
    none."""
    for service in ("encoder", "decoder"):
        workload = rendered.workload(service)
        spec = pod_spec(workload)
        limits = main_container(workload)["resources"]["limits"]
        device = parsed_service(rendered, service).device
        where = f"{rendered.name}: tessera-{service} on {device}"
        if device.startswith("cuda"):
            assert isinstance(limits.get(GPU), int) and limits[GPU] >= 1, where
            assert spec.get("nodeSelector"), f"{where}: no nodeSelector"
            assert any(t.get("key") == GPU for t in spec.get("tolerations", [])), where
        else:
            assert GPU not in limits, where


def test_gpu_overlay_gives_every_decoder_a_gpu(renders):
    gpu = renders["gpu"]
    container = main_container(gpu.workload("decoder"))
    assert container["resources"]["limits"][GPU] == 1
    assert parsed_service(gpu, "decoder").device == "cuda"
    assert parsed_service(gpu, "decoder").dtype == "bfloat16"
    strategy = gpu.workload("decoder")["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxSurge"] == 0, "a surge pod would wait for a GPU that is not free"
    for name in ("cpu-dev",):
        for workload in renders[name].workloads():
            for c in all_containers(workload):
                assert GPU not in c["resources"].get("limits", {}), f"{name}: no GPUs"


# --- availability and scaling ----------------------------------------------------------------


def test_every_workload_has_a_disruption_budget_that_allows_drains(rendered: Rendered):
    budgets = rendered.kind("PodDisruptionBudget")
    for workload in rendered.workloads():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [
            b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, f"{rendered.name}: {workload['metadata']['name']}"
        spec = matching[0]["spec"]
        # Never a budget that blocks every eviction (a node drain would hang).
        assert spec.get("maxUnavailable", 0) >= 1 or "minAvailable" in spec


def test_encoders_autoscale_on_their_queue_with_cpu_as_fallback(rendered: Rendered):
    (hpa,) = rendered.kind("HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "tessera-encoder",
    }
    pods = {m["pods"]["metric"]["name"] for m in spec["metrics"] if m["type"] == "Pods"}
    assert pods == {"tessera_encoder_queue_depth", "tessera_encoder_busy_fraction"}
    resources = [m["resource"]["name"] for m in spec["metrics"] if m["type"] == "Resource"]
    assert resources == ["cpu"]
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    # The HPA owns the encoder count; decoders (a GPU each) are scaled by hand.
    assert "replicas" not in rendered.workload("encoder")["spec"]
    assert "replicas" in rendered.workload("decoder")["spec"]


def monitoring(name: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((K8S / "monitoring" / name).read_text()) if d]


def test_the_adapter_rules_serve_the_metrics_the_autoscaler_reads(renders):
    (values,) = monitoring("prometheus-adapter-values.yaml")
    served = {rule["name"]["as"] for rule in values["rules"]["custom"]}
    for rendered in renders.values():
        (hpa,) = rendered.kind("HorizontalPodAutoscaler")
        wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if "pods" in m}
        assert wanted <= served, f"{rendered.name}: no adapter rule for {wanted - served}"
    for rule in values["rules"]["custom"]:
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    (pod_monitor,) = monitoring("podmonitor.yaml")
    endpoints = {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]}
    for service in SERVICES:
        workload = renders["cpu-dev"].workload(service)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        scraped = {
            p["name"]
            for p in main_container(workload)["ports"]
            if p["containerPort"]
            == int(workload["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"])
        }
        assert scraped & endpoints, f"the PodMonitor scrapes no port of tessera-{service}"
    (scaled,) = monitoring("keda-scaledobject.yaml")
    assert scaled["spec"]["scaleTargetRef"]["name"] == "tessera-encoder"


def test_cpu_dev_runs_one_replica_of_each(renders):
    cpu = renders["cpu-dev"]
    for workload in cpu.workloads():
        assert workload["spec"].get("replicas", 1) == 1, workload["metadata"]["name"]
    (hpa,) = cpu.kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 1


# --- Redis ------------------------------------------------------------------------------------


def test_redis_is_a_bounded_lru_cache_without_persistence(rendered: Rendered):
    redis = rendered.get("StatefulSet", "tessera-redis")
    assert "volumeClaimTemplates" not in redis["spec"], "a cache: nothing to persist"
    container = main_container(redis)
    args = container_args(rendered, container)
    assert redis_server_script(container), "runs redis-server with the args below"
    assert flag_value(args, "--maxmemory-policy") == "allkeys-lru"
    assert flag_value(args, "--save") == "", "no RDB snapshots"
    assert flag_value(args, "--appendonly") == "no", "no AOF"
    maxmemory = redis_bytes(flag_value(args, "--maxmemory"))
    limit = memory_bytes(container["resources"]["limits"]["memory"])
    assert 0 < maxmemory <= 0.8 * limit, (
        f"{rendered.name}: maxmemory {maxmemory} must leave room under the {limit} B limit "
        "(fragmentation, buffers), or Redis is OOM-killed instead of evicting"
    )


# --- model weights ----------------------------------------------------------------------------


def test_every_service_finds_its_model_under_the_models_volume(rendered: Rendered):
    for service in SERVICES:
        workload = rendered.workload(service)
        container = main_container(workload)
        model = parsed_service(rendered, service).model
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        models = mounts["models"]
        assert model.startswith(models["mountPath"] + "/"), (rendered.name, service, model)
        assert models.get("readOnly") is True, "serving containers never write weights"
        volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == "models")
        if "emptyDir" in volume:
            # Something must fill it before the service starts: an init container.
            writers = [
                c
                for c in pod_spec(workload).get("initContainers", [])
                if any(m["name"] == "models" and not m.get("readOnly") for m in c["volumeMounts"])
            ]
            assert writers, f"{rendered.name}: tessera-{service}: empty models volume"
        else:
            claim = volume["persistentVolumeClaim"]
            assert claim.get("readOnly") is True
            rendered.get("PersistentVolumeClaim", claim["claimName"])


def test_cpu_dev_generates_the_tiny_demo_model_where_the_services_look(renders):
    cpu = renders["cpu-dev"]
    for service in SERVICES:
        workload = cpu.workload(service)
        (init,) = pod_spec(workload)["initContainers"]
        args = container_args(cpu, init)
        assert args[:2] == ["make-demo-model", parsed_service(cpu, service).model]
        assert flag_value(args, "--size") == "tiny"
        assert init["image"] == main_container(workload)["image"]


def test_one_tessera_image_never_latest(rendered: Rendered):
    images = {
        c["image"]
        for w in rendered.workloads()
        for c in all_containers(w)
        if is_tessera_image(c["image"])
    }
    assert len(images) == 1, images
    for workload in rendered.workloads():
        for container in all_containers(workload):
            image = container["image"]
            assert ":" in image and not image.endswith(":latest"), image


# --- network policies -------------------------------------------------------------------------

NS = "tessera"


def pods_of(rendered: Rendered) -> dict[str, Pod]:
    pods = {
        workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: Pod(
            workload["metadata"]["name"],
            NS,
            tuple(sorted(workload["spec"]["template"]["metadata"]["labels"].items())),
        )
        for workload in rendered.workloads()
    }
    pods["stranger"] = Pod("stranger", NS, (("app", "something-else"),))
    pods["outsider"] = Pod("outsider", "elsewhere", (("app", "prometheus"),))
    pods["dns"] = Pod("coredns", "kube-system", (("k8s-app", "kube-dns"),))
    return pods


def test_network_policies_allow_exactly_the_paths_tessera_uses(rendered: Rendered):
    policies = rendered.kind("NetworkPolicy")
    assert policies
    pods = pods_of(rendered)
    gateway, encoder, decoder, cache = (pods[n] for n in ("gateway", "encoder", "decoder", "cache"))
    allowed = {
        ("gateway", "encoder", 50052),
        ("gateway", "decoder", 50053),
        ("decoder", "encoder", 50052),
        ("encoder", "cache", 6379),
        ("stranger", "gateway", 50051),
        ("outsider", "gateway", 50051),
        ("stranger", "gateway", 8000),
        ("outsider", "gateway", 8000),
    }
    ports = [("gateway", 50051), ("gateway", 8000), ("encoder", 50052), ("decoder", 50053)]
    ports.append(("cache", 6379))
    # The health-only port (components/mtls) is for the kubelet, which probes from the
    # node: no pod, in the namespace or outside, may reach it.
    ports += [(service, HEALTH_PORT) for service in SERVICES]
    sources = ["gateway", "encoder", "decoder", "cache", "stranger", "outsider"]
    wrong = []
    for src in sources:
        for dst, port in ports:
            if src == dst:
                continue
            expected = (src, dst, port) in allowed
            if reachable(policies, pods[src], pods[dst], port) != expected:
                wrong.append(f"{src} -> {dst}:{port} should be {'open' if expected else 'shut'}")
    assert not wrong, f"{rendered.name}:\n" + "\n".join(wrong)
    for pod in (gateway, encoder, decoder, cache):
        assert reachable(policies, pod, pods["dns"], 53, "UDP"), f"{pod.name}: DNS"
        assert reachable(policies, pod, pods["dns"], 53, "TCP"), f"{pod.name}: DNS over TCP"
    # Prometheus, from its own namespace, scrapes the services but not Redis.
    for pod in (gateway, encoder, decoder):
        assert reachable(policies, pods["outsider"], pod, 9100), f"{pod.name}: /metrics"
    assert not reachable(policies, pods["outsider"], cache, 9100)


# --- secrets ------------------------------------------------------------------------------------

SECRET_MARK = "<secret>"  # what container_env puts for a variable from a secretKeyRef


def redis_server_script(container: Obj) -> str:
    """The shell script that execs redis-server with the container's args plus config on
    stdin (`sh -c SCRIPT redis-server ARGS...`), or "" if the container runs otherwise."""
    command = container.get("command", [])
    if command[:2] != ["sh", "-c"] or command[3:] != ["redis-server"]:
        return ""
    script = command[2]
    return script if re.search(r'^exec redis-server "\$@" - <<', script, re.M) else ""


def secret_mount(rendered: Rendered, workload: Obj, container: Obj, path: str) -> tuple[str, str]:
    """(Secret name, key) of the file at `path`, which must come from a read-only mount of
    a Secret volume."""
    where = f"{rendered.name}: {workload['metadata']['name']} reads {path}"
    file = PurePosixPath(path)
    mounts = [
        m for m in container.get("volumeMounts", []) if PurePosixPath(m["mountPath"]) == file.parent
    ]
    assert len(mounts) == 1, f"{where}: no volume mounted at {file.parent}"
    (mount,) = mounts
    assert mount.get("readOnly") is True, f"{where}: mount it read-only"
    volume = next(v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"])
    assert "secret" in volume, f"{where}: not from a Secret"
    items = {item["path"]: item["key"] for item in volume["secret"].get("items", [])}
    return volume["secret"]["secretName"], items.get(file.name, file.name)


def secret_values(rendered: Rendered) -> list[str]:
    values = []
    for secret in rendered.kind("Secret"):
        values += [base64.b64decode(v).decode() for v in secret.get("data", {}).values()]
        values += list(secret.get("stringData", {}).values())
    return values


def test_redis_requires_the_password_from_a_secret_with_protected_mode_on(rendered: Rendered):
    redis = rendered.get("StatefulSet", "tessera-redis")
    container = main_container(redis)
    args = container_args(rendered, container)
    assert flag_value(args, "--protected-mode") == "yes"
    script = redis_server_script(container)
    match = re.search(r'^requirepass "\$\(cat (\S+)\)"$', script, re.M)
    assert match, f"{rendered.name}: redis-server gets no requirepass from a file:\n{script}"
    redis_secret = secret_mount(rendered, redis, container, match.group(1))
    # The readiness probe authenticates from the same file.
    probe = " ".join(container["readinessProbe"]["exec"]["command"])
    assert f'REDISCLI_AUTH="$(cat {match.group(1)})"' in probe and "grep -q PONG" in probe
    encoder = rendered.workload("encoder")
    parsed = parsed_service(rendered, "encoder")
    encoder_container = main_container(encoder)
    assert secret_mount(rendered, encoder, encoder_container, parsed.redis_password_file) == (
        redis_secret
    ), "the encoders' password file is the one Redis requires"
    mac_secret = secret_mount(rendered, encoder, encoder_container, parsed.cache_mac_key_file)
    assert mac_secret[0] != redis_secret[0], "the MAC key is a Secret of its own"
    readme = (ROOT / "deploy" / "README.md").read_text()
    for name, key in (redis_secret, mac_secret):
        generated = any(s["metadata"]["name"] == name for s in rendered.kind("Secret"))
        documented = f"create secret generic {name} --from-file={key}=" in readme
        assert generated or documented, (
            f"{rendered.name}: Secret {name} is neither generated nor documented for operators"
        )


def test_no_secret_in_a_config_map_an_argument_or_a_plain_variable(rendered: Rendered):
    """Secrets reach processes as files (or a probe's environment), never through argv
    (`ps`), ConfigMaps or plain env values."""
    parsed = parsed_service(rendered, "encoder")
    assert parsed.redis_password_file and parsed.cache_mac_key_file, "secrets come as files"
    secrets = secret_values(rendered)
    assert all(len(value) >= 16 for value in secrets), "no trivially short secrets"
    for config_map in rendered.kind("ConfigMap"):
        for key, value in config_map.get("data", {}).items():
            where = f"{rendered.name}: ConfigMap {config_map['metadata']['name']} {key}"
            assert not any(secret in value for secret in secrets), where
            assert not re.search(r"PASSWORD|SECRET|MAC_KEY", key), f"{where}: a secret's name"
    for workload in rendered.workloads():
        for container in all_containers(workload):
            where = f"{rendered.name}: {workload['metadata']['name']}/{container['name']}"
            argv = [*container.get("command", []), *container_args(rendered, container)]
            probe = container.get("readinessProbe", {}).get("exec", {}).get("command", [])
            plain = [e["value"] for e in container.get("env", []) if "value" in e]
            for text in [*argv, *probe, *plain]:
                assert SECRET_MARK not in text, f"{where}: a secretKeyRef expanded into argv"
                assert not any(secret in text for secret in secrets), f"{where}: {text!r}"
            assert flag_value(argv, "--requirepass") is None, f"{where}: a password in argv"


# --- mutual TLS (components/mtls) ----------------------------------------------------------

TLS_DIR = "/etc/tessera/tls"
TLS_ENV = {
    "TESSERA_TLS_CERT_FILE": f"{TLS_DIR}/tls.crt",
    "TESSERA_TLS_KEY_FILE": f"{TLS_DIR}/tls.key",
    "TESSERA_TLS_CA_FILE": f"{TLS_DIR}/ca.crt",
}
ROLES = ("gateway", "decoder", "encoder", "client")


def role_dns_names(role: str) -> set[str]:
    name = f"tessera-{role}"
    return {name, f"{name}.tessera.svc", f"{name}.tessera.svc.cluster.local", "localhost"}


@pytest.mark.parametrize("service", SERVICES)
def test_mtls_gives_each_service_its_role_certificate_and_a_health_port(renders, service):
    mtls = renders["cpu-dev+mtls"]
    workload = mtls.workload(service)
    container = main_container(workload)
    env = container_env(mtls, container)
    assert {k: env.get(k) for k in TLS_ENV} == TLS_ENV
    for path in TLS_ENV.values():
        secret, key = secret_mount(mtls, workload, container, path)
        assert secret == f"tessera-tls-{service}", f"{service} reads {path} from {secret}"
        assert key == PurePosixPath(path).name, "cert-manager's keys, used as they are"
    parsed = parsed_service(mtls, service)
    assert (parsed.tls_cert_file, parsed.tls_key_file, parsed.tls_ca_file) == tuple(
        TLS_ENV.values()
    ), "the service's own parser reads the files from the environment"
    assert parsed.health_port == HEALTH_PORT
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[kind]["grpc"]["port"] == HEALTH_PORT, kind
    # The health port is for the kubelet only: in no Service.
    svc = mtls.get("Service", f"tessera-{service}")
    assert HEALTH_PORT not in [p.get("targetPort") for p in svc["spec"]["ports"]]
    assert "health" not in [p.get("targetPort") for p in svc["spec"]["ports"]]


def test_mtls_issues_one_certificate_per_role_from_one_ca(renders):
    mtls = renders["cpu-dev+mtls"]
    issuers = {i["metadata"]["name"]: i["spec"] for i in mtls.kind("Issuer")}
    certificates = {c["metadata"]["name"]: c["spec"] for c in mtls.kind("Certificate")}
    # The bootstrap: a self-signed issuer signs the CA, whose Issuer signs the roles.
    ca = certificates["tessera-ca"]
    assert ca["isCA"] is True
    assert issuers[ca["issuerRef"]["name"]] == {"selfSigned": {}}
    (ca_issuer,) = [n for n, spec in issuers.items() if spec.get("ca")]
    assert issuers[ca_issuer]["ca"]["secretName"] == ca["secretName"]
    for role in ROLES:
        spec = certificates[f"tessera-{role}"]
        assert spec["commonName"] == role, "the caller checks read the role from the CN"
        assert spec["secretName"] == f"tessera-tls-{role}"
        assert spec["issuerRef"] == {
            "name": ca_issuer,
            "kind": "Issuer",
            "group": "cert-manager.io",
        }
        assert {"server auth", "client auth"} <= set(spec["usages"]), role
        assert set(spec["dnsNames"]) == role_dns_names(role)
        assert not spec.get("isCA")
    assert set(certificates) == {"tessera-ca", *(f"tessera-{r}" for r in ROLES)}


def test_without_the_mtls_component_nothing_changes(renders):
    """cpu-dev+mtls is cpu-dev plus exactly the TLS pieces; cpu-dev itself has none."""
    plain, mtls = renders["cpu-dev"], renders["cpu-dev+mtls"]
    assert not plain.kind("Certificate") and not plain.kind("Issuer")
    for service in SERVICES:
        parsed = parsed_service(plain, service)
        assert not (parsed.tls_cert_file or parsed.tls_key_file or parsed.tls_ca_file)
        assert parsed.health_port == 0
    added = {"Certificate", "Issuer"}
    assert set(mtls.by_kind) - set(plain.by_kind) == added
    for kind, objects in plain.by_kind.items():
        if kind == "Deployment":
            continue
        assert objects == mtls.kind(kind), f"the mtls component changed a {kind}"
    for service in SERVICES:
        without = strip_mtls(mtls.workload(service))
        assert without == plain.workload(service), f"tessera-{service}: more than TLS changed"


def strip_mtls(workload: Obj) -> Obj:
    """A copy of an mtls workload with what components/mtls adds taken out again, the
    probes set back to the gRPC port."""
    copy = yaml.safe_load(yaml.safe_dump(workload))
    spec = pod_spec(copy)
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "tls"]
    container = main_container(copy)
    container["args"] = [a for a in container["args"] if not a.startswith("--health-port")]
    container["env"] = [e for e in container["env"] if e["name"] not in TLS_ENV]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "tls"]
    container["ports"] = [p for p in container["ports"] if p["name"] != "health"]
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        container[kind]["grpc"]["port"] = grpc_port
    return copy


def test_the_mtls_component_is_documented_and_off_by_default():
    for overlay in ("cpu-dev", "gpu"):
        text = (K8S / "overlays" / overlay / "kustomization.yaml").read_text()
        assert "components/mtls" not in text, f"{overlay}: mTLS is opt-in"
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "../../components/mtls" in readme and "cert-manager" in readme
    assert "tessera-tls-client" in readme, "callers of the gateway need the client Secret"
