"""Real service processes on loopback for tests: started once per session, shared."""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tessera.children import Child, Process, stop_children, wait_healthy
from tessera.launcher import free_port
from tessera.testbed.procs import interrupt_on_sigterm
from tessera.testbed.zygote import Zygote
from tessera.tls import TlsFiles, tls_args

READY_TIMEOUT_SECONDS = 180.0
CLI = [sys.executable, "-m", "tessera.cli"]


@dataclass
class Cluster:
    """Processes started together; `address(name)` finds one. `client_tls`: the files
    the test's own health checks present (services with mutual TLS want one).

    `zygote`, when set (the test suite sets it for its session), forks every service
    from one process that imported their modules once instead of starting it cold;
    `cold` starts this cluster's as `python -m tessera.cli` all the same (for a test of
    what the process itself shows, such as its command line)."""

    zygote: ClassVar[Zygote | None] = None

    children: list[Child] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    client_tls: TlsFiles | None = None
    cold: bool = False

    def __post_init__(self) -> None:
        # A harness that raises, or never calls stop(), must not leave its services
        # running (ports, and gigabytes each): those started cold stop when this process
        # exits, also when it is told to (SIGTERM). Forked ones end with their zygote.
        atexit.register(self._stop_cold)

    def start(self, name: str, service: str, args: list[str]) -> str:
        """Starts `tessera <service> <args> --port <free>`; returns its address."""
        address = f"127.0.0.1:{free_port()}"
        command = [*CLI, service, *args]
        self.commands[name] = [*command, "--port", address.split(":")[1]]
        self.children.append(Child(name, address, self._spawn(name)))
        return address

    def _spawn(self, name: str) -> Process:
        log_path = Path(tempfile.mkdtemp(prefix=f"tessera-{name}-")) / "log.txt"
        self.logs[name] = log_path
        env = {**os.environ, "TESSERA_LOG_LEVEL": "INFO"}
        command = self.commands[name]
        if self.zygote is not None and not self.cold:
            return self.zygote.spawn(command[len(CLI) :], log_path, env, argv0=command[0])
        log = log_path.open("w")
        interrupt_on_sigterm()
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def _stop_cold(self) -> None:
        cold = [c for c in self.children if isinstance(c.process, subprocess.Popen)]
        stop_children(cold, grace_seconds=10)

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash."""
        child = self.child(name)
        child.process.kill()
        child.process.wait(30)

    def restart(self, name: str) -> None:
        """Starts a killed child again, on its old port (as Kubernetes restarts a pod)."""
        old = self.child(name)
        self.children[self.children.index(old)] = Child(name, old.address, self._spawn(name))

    def start_stack(
        self,
        model_dir: Path,
        encoder_args: Sequence[str] = (),
        tls: Mapping[str, TlsFiles] | None = None,
        gateway_args: Sequence[str] = (),
    ) -> None:
        """One encoder, one decoder and a gateway in front of them, on `model_dir`;
        with `tls` (files per role), each service on its role's files."""

        def args(service: str, *extra: str) -> list[str]:
            security = tls_args(tls[service]) if tls else []
            return ["--model", str(model_dir), *security, *extra]

        encoder = self.start("encoder", "encoder", args("encoder", *encoder_args))
        decoder = self.start("decoder", "decoder", args("decoder", "--encoders", encoder))
        routes = ["--encoders", encoder, "--decoders", decoder, *gateway_args]
        self.start("gateway", "gateway", args("gateway", *routes))

    def wait_ready(self) -> None:
        try:
            wait_healthy(self.children, READY_TIMEOUT_SECONDS, self.client_tls)
        except SystemExit as error:
            raise RuntimeError(f"{error}\n{self.dump_logs()}") from None

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def address(self, name: str) -> str:
        return self.child(name).address

    def log_text(self, name: str) -> str:
        return self.logs[name].read_text()

    def dump_logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log_text(name)[-3000:]}" for name in self.logs)

    def stop(self) -> None:
        stop_children(self.children, grace_seconds=10)

    def ready_field(self, name: str, field: str) -> str:
        """A `field=value` of the service's ready line: what it chose at start."""
        ready = next(line for line in self.log_text(name).splitlines() if " ready: " in line)
        match = re.search(rf" {field}=(\S+)", ready)
        assert match, ready
        return match.group(1)

    def fingerprint(self, name: str = "gateway") -> str:
        """The model fingerprint a service logged at start: what content hashes cover."""
        match = re.search(r"fingerprint=(\w+)", self.log_text(name))
        assert match, self.log_text(name)
        return match.group(1)

    def terminate(self, name: str) -> int:
        child = self.child(name)
        child.process.send_signal(signal.SIGTERM)
        return child.process.wait(30)


@contextmanager
def http_gateway(cluster: Cluster, model_dir, *extra: str) -> Iterator[Cluster]:
    """A gateway of its own (`extra`: its flags) with the HTTP API, in front of
    `cluster`'s encoder and decoder; its base URL is `.http`. Stopped on leaving."""
    own = Cluster()
    port = free_port()
    try:
        own.start(
            "gateway",
            "gateway",
            [
                "--model",
                str(model_dir),
                "--encoders",
                cluster.address("encoder"),
                "--decoders",
                cluster.address("decoder"),
                "--http-port",
                str(port),
                *extra,
            ],
        )
        own.wait_ready()
        own.http = f"http://127.0.0.1:{port}"
        yield own
    finally:
        own.stop()


def scrape_metrics(url: str) -> dict[str, float]:
    """Every sample of a Prometheus endpoint as `name{label=value,...}` (labels sorted)
    -> value."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10).text
    return {
        sample.name + "{" + ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())) + "}": (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
