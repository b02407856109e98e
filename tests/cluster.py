"""Real service processes on loopback for tests: started once per session, shared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tessera.launcher import Child, free_port, stop_children, wait_healthy

READY_TIMEOUT_SECONDS = 180.0


@dataclass
class Cluster:
    """Processes started together; `address(name)` finds one."""

    children: list[Child] = field(default_factory=list)
    logs: dict[str, Path] = field(default_factory=dict)

    def start(self, name: str, service: str, args: list[str]) -> str:
        """Starts `tessera <service> <args> --port <free>`; returns its address."""
        address = f"127.0.0.1:{free_port()}"
        log_path = Path(tempfile.mkdtemp(prefix=f"tessera-{name}-")) / "log.txt"
        log_file = log_path.open("w")
        process = subprocess.Popen(
            [sys.executable, "-m", "tessera.cli", service, *args, "--port", address.split(":")[1]],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TESSERA_LOG_LEVEL": "INFO"},
        )
        self.children.append(Child(name, address, process))
        self.logs[name] = log_path
        return address

    def wait_ready(self) -> None:
        try:
            wait_healthy(self.children, READY_TIMEOUT_SECONDS)
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

    def terminate(self, name: str) -> int:
        child = self.child(name)
        child.process.send_signal(signal.SIGTERM)
        return child.process.wait(30)
