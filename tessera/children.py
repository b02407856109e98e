"""The service processes a launcher starts (`tessera serve`, the tests' clusters): each a
`Child` by name and address, waited on until it reports SERVING on grpc.health.v1, and
stopped with SIGTERM, then SIGKILL after a grace period."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tessera.tls import TlsFiles, sync_channel


class Process(Protocol):
    """What `Child` needs of a process: `subprocess.Popen`'s, or a test's forked
    service (tessera.testbed.zygote)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, signum: int) -> None: ...
    def kill(self) -> None: ...


@dataclass
class Child:
    name: str
    address: str
    process: Process


def wait_healthy(
    children: list[Child], timeout_seconds: float, tls: TlsFiles | None = None
) -> None:
    """Until every child reports SERVING; `tls`: the client files to ask with."""
    deadline = time.monotonic() + timeout_seconds
    for child in children:
        with sync_channel(child.address, tls) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                _stop_if_one_exited(children)
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"the {child.name} was not ready after {timeout_seconds:.0f}s")
                time.sleep(0.2)


def _stop_if_one_exited(children: list[Child]) -> None:
    """Any child that exited while starting ends the start: it printed its own line (why);
    this says which one, and that the others are stopped."""
    for child in children:
        if child.process.poll() is not None:
            raise SystemExit(
                f"tessera serve: the {child.name} failed to start (exit code "
                f"{child.process.returncode}); stopping the others"
            )


def start_child(name: str, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tessera.cli", name, *args])


def stop_children(children: list[Child], grace_seconds: float = 15.0) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
