"""A fleet of real processes (gateway, decoders, encoders, one Redis) and the process
faults every fleet supports; `LoopbackFleet` runs it all on 127.0.0.1.

Every role is started as Kubernetes would start its pod, `tessera <service> --model M
--host H --port P ...`, with the replicas of a role found through one target each:
`--encoders`, `--decoders` (a list on loopback, `dns:///name:port` on the test hosts).
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tessera.launcher import free_port
from tessera.testbed.control import LinkShape, NetworkFaultsUnsupported
from tessera.testbed.procs import Proc

ROLES = ("redis", "encoder", "decoder", "gateway")  # the order they start in


@dataclass(frozen=True)
class FleetPlan:
    """What to run: the checkpoint, how many replicas, extra flags per service
    (`{"decoder": ["--max-num-seqs", "8"]}`)."""

    model: str
    num_decoders: int = 2
    num_encoders: int = 3
    extra_flags: dict[str, list[str]] = field(default_factory=dict)

    def names(self) -> list[str]:
        """Process names in start order: redis, encoder-0.., decoder-0.., gateway."""
        return [
            "redis",
            *(f"encoder-{i}" for i in range(self.num_encoders)),
            *(f"decoder-{i}" for i in range(self.num_decoders)),
            "gateway",
        ]


def role_of(name: str) -> str:
    return name.split("-", 1)[0]


def service_command(plan: FleetPlan, name: str, host: str, port: int, routes: list[str]):
    """`tessera <service> ...` for process `name`; `routes`: its --encoders/--decoders/
    --redis-url/--http-port flags."""
    service = role_of(name)
    return [
        sys.executable,
        "-m",
        "tessera.cli",
        service,
        "--model",
        plan.model,
        "--host",
        host,
        "--port",
        str(port),
        *routes,
        *plan.extra_flags.get(service, []),
    ]


def redis_command(host: str, port: int, directory: Path) -> list[str]:
    """A redis-server that keeps nothing on disk (a restart starts empty, like a pod)."""
    return [
        shutil.which("redis-server") or "redis-server",
        "--bind",
        host,
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--dir",
        str(directory),
    ]


class Fleet:
    """Process faults over `procs` (name -> Proc). Subclasses lay out the hosts and
    may support network faults."""

    def __init__(self, plan: FleetPlan) -> None:
        self.plan = plan
        self.procs: dict[str, Proc] = {}
        self.http_port = 0
        self.work_dir = Path(tempfile.mkdtemp(prefix="tessera-fleet-"))

    # -- FleetControl: addresses --
    @property
    def gateway_address(self) -> str:
        return self.address("gateway")

    @property
    def gateway_http(self) -> str:
        return f"http://{self.address('gateway').rsplit(':', 1)[0]}:{self.http_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{self.address('redis')}/0"

    def names(self, role: str) -> list[str]:
        return [name for name in self.procs if role_of(name) == role]

    def address(self, name: str) -> str:
        return self.procs[name].address

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def log_text(self, name: str) -> str:
        return self.procs[name].tail(100_000)

    # -- FleetControl: process faults --
    def kill(self, name: str) -> None:
        self.procs[name].kill()

    def terminate(self, name: str) -> int:
        return self.procs[name].terminate()

    def pause(self, name: str) -> None:
        self.procs[name].signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.procs[name].signal(signal.SIGCONT)

    def restart(self, name: str) -> None:
        self.restart_all([name])

    def restart_all(self, names: list[str]) -> None:
        """Starts them all again at once (their imports and model loads overlap), then
        waits until each serves."""
        for name in names:
            proc = self.procs[name]
            if proc.running():
                proc.kill()
            proc.start()
        for name in names:
            self.procs[name].wait_serving()

    # -- FleetControl: network faults (test hosts only) --
    def partition(self, a: str, b: str) -> None:
        raise NetworkFaultsUnsupported("partitions need test hosts (NetFleet)")

    def heal(self, a: str, b: str) -> None:
        raise NetworkFaultsUnsupported("partitions need test hosts (NetFleet)")

    def shape(self, a: str, b: str, link: LinkShape) -> None:
        raise NetworkFaultsUnsupported("link shaping needs test hosts (NetFleet)")

    def unshape(self, a: str, b: str) -> None:
        raise NetworkFaultsUnsupported("link shaping needs test hosts (NetFleet)")

    def set_dns(self, name: str, addresses: list[str]) -> None:
        raise NetworkFaultsUnsupported("DNS answers need test hosts (NetFleet)")

    # -- lifecycle --
    def start_all(self) -> None:
        """Starts every role in order, each role's replicas together, and waits for each
        role to serve before the next (the gateway needs its replicas)."""
        for role in ROLES:
            procs = [self.procs[name] for name in self.names(role)]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.wait_serving()

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.terminate(grace_seconds=10)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self):
        """`with fleet:` only ensures `stop()`; `start_all()` starts it."""
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def describe(self) -> str:
        """One line per process: name, address, pid."""
        return "\n".join(
            f"  {name:<10} {proc.address:<22} pid {proc.process.pid if proc.process else '-'}"
            for name, proc in self.procs.items()
        )


class LoopbackFleet(Fleet):
    """Every process on 127.0.0.1, each on its own free port."""

    def __init__(self, plan: FleetPlan) -> None:
        super().__init__(plan)
        host = "127.0.0.1"
        ports = {name: free_port() for name in plan.names()}
        self.http_port = free_port()

        def targets(role: str) -> str:
            return ",".join(
                f"{host}:{port}" for name, port in ports.items() if role_of(name) == role
            )

        routes = {
            "encoder": ["--redis-url", f"redis://{host}:{ports['redis']}/0"],
            "decoder": ["--encoders", targets("encoder")],
            "gateway": [
                "--encoders",
                targets("encoder"),
                "--decoders",
                targets("decoder"),
                "--http-port",
                str(self.http_port),
            ],
        }
        for name, port in ports.items():
            address = f"{host}:{port}"
            if name == "redis":
                command, kind = redis_command(host, port, self.work_dir), "redis"
            else:
                command = service_command(plan, name, host, port, routes[role_of(name)])
                kind = "grpc"
            self.procs[name] = Proc(name, command, address, kind, log_path=self.work_dir)
