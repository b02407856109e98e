"""One process of a test fleet: started (optionally inside a network namespace), logged
to a file, signalled, restarted on the same address, and waited on until it serves."""

from __future__ import annotations

import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

MAX_START_SECONDS = 180.0  # torch imports and model loads on a loaded 2-core machine


def interrupt_on_sigterm() -> None:
    """Makes SIGTERM (`timeout`'s, a CI runner's) end this process as Ctrl-C does:
    through `finally` blocks, fixture teardowns and exit hooks, which stop the services
    it started. Python's default ends it at once, hooks unrun. (KeyboardInterrupt, not
    SystemExit: pytest reports a SystemExit inside a test as that test's failure and
    goes on.) Only where SIGTERM still has that default, and on the main thread, the
    only one that may set handlers: a handler the program chose is its own."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class ProcessExitedError(RuntimeError):
    """A process stopped while the fleet waited for it to serve."""


@dataclass
class Proc:
    """`command` runs as `name`; `namespace` (if any) is the network namespace it runs in;
    `address` is host:port where it serves (gRPC health, or Redis PING for `kind`
    "redis")."""

    name: str
    command: list[str]
    address: str
    kind: str = "grpc"  # "grpc", "redis" or "process"
    namespace: str | None = None
    log_path: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tsr-")))
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.log_path = self.log_path / f"{self.name}.log"

    def start(self) -> None:
        prefix = ["ip", "netns", "exec", self.namespace] if self.namespace else []
        # `ip netns exec` execs the command: the pid is the service's own.
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                [*prefix, *self.command], stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        if self.process is None or self.process.poll() is not None:
            raise ProcessExitedError(f"{self.name} is not running")
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.running():
            self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process is not None:
            self.signal(signal.SIGCONT)  # a stopped process must be able to die
            self.process.kill()
            self.process.wait()

    def terminate(self, grace_seconds: float = 60.0) -> int:
        """SIGTERM, then SIGKILL after `grace_seconds`; returns the exit code."""
        if self.process is None:
            return 0
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def wait_serving(self, timeout_seconds: float = MAX_START_SECONDS) -> None:
        deadline = time.monotonic() + timeout_seconds
        while not self._serves():
            if not self.running():
                raise ProcessExitedError(f"{self.name} exited while starting:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not serving after {timeout_seconds:.0f} s")
            time.sleep(0.1)

    def _serves(self) -> bool:
        if self.kind == "process":  # nothing to ask: running is all it promises
            return self.running()
        if self.kind == "redis":
            host, port = self.address.rsplit(":", 1)
            client = redis.Redis(host=host, port=int(port), socket_timeout=1)
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False
            finally:
                client.close()
        with grpc.insecure_channel(self.address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def tail(self, num_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-num_chars:]
        except OSError:
            return ""
