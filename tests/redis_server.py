"""A private redis-server for tests that kill, pause or corrupt Redis (never the shared one)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(cluster: bool = False) -> int:
    """A free port; for a cluster node also its bus port (port + 10000) must exist and be
    free, or redis-server exits at once."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if not cluster or (port + 10000 <= 65535 and port_is_free(port + 10000)):
            return port


class PrivateRedis:
    """A throwaway redis-server on a free port, no persistence; optionally a one-node
    cluster owning every slot."""

    def __init__(self, directory: Path, cluster: bool = False) -> None:
        self.port = free_port(cluster)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = directory
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        args += ["--dir", str(self.directory)]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_until(lambda client: client.ping())
        if self.cluster:
            with self.client() as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            self._wait_until(lambda client: client.cluster("info")["cluster_state"] == "ok")

    def _wait_until(self, ready: Callable[[redis.Redis], Any]) -> None:
        deadline = time.monotonic() + 5
        while True:
            with self.client() as client:
                try:
                    if ready(client):
                        return
                except redis.ConnectionError:
                    pass
            if time.monotonic() > deadline:
                code = self.process.poll() if self.process else None
                raise RuntimeError(f"redis-server on port {self.port} not ready (exit {code})")
            time.sleep(0.01)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
