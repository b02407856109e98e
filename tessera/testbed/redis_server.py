"""A private redis-server for tests that kill, pause or corrupt Redis (never the shared
one), or that need it locked down: a password, ACL users, TLS."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tessera.launcher import free_port as service_free_port
from tessera.testbed.tls_files import TlsFiles


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
        port = service_free_port()  # never one handed to a service still starting
        if not cluster or (port + 10000 <= 65535 and port_is_free(port + 10000)):
            return port


@dataclass(frozen=True)
class RedisSecurity:
    """How a private server is locked down. `password` is the default user's
    (requirepass), which `PrivateRedis.client()` uses as the admin; `users` are ACL rules
    (`"tessera on >secret ~tessera:* +@all"`); `tls` serves TLS only, and checks client
    certificates against the CA."""

    password: str | None = None
    users: tuple[str, ...] = ()
    tls: TlsFiles | None = None


class PrivateRedis:
    """A throwaway redis-server on a free port, no persistence; optionally a one-node
    cluster owning every slot, and optionally locked down (`RedisSecurity`)."""

    def __init__(
        self, directory: Path, cluster: bool = False, security: RedisSecurity | None = None
    ) -> None:
        self.port = free_port(cluster)
        self.security = security or RedisSecurity()
        scheme = "rediss" if self.security.tls else "redis"
        self.url = f"{scheme}://127.0.0.1:{self.port}/0"
        self.directory = directory
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # Secrets go in a config file, not in argv.
        config = self.directory / "redis.conf"
        config.write_text(self._config())
        args = ["redis-server", str(config), "--bind", "127.0.0.1"]
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
        """A client of the default user (the admin, with the password if there is one)."""
        options: dict[str, Any] = {"password": self.security.password}
        tls = self.security.tls
        if tls is not None:
            options.update(
                ssl=True,
                ssl_ca_certs=str(tls.ca),
                ssl_certfile=str(tls.client_cert),
                ssl_keyfile=str(tls.client_key),
            )
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **options)

    def _config(self) -> str:
        security = self.security
        lines = []
        if security.tls is None:
            lines.append(f"port {self.port}")
        else:
            tls = security.tls
            lines += ["port 0", f"tls-port {self.port}", "tls-auth-clients yes"]
            lines += [f'tls-cert-file "{tls.server_cert}"', f'tls-key-file "{tls.server_key}"']
            lines.append(f'tls-ca-cert-file "{tls.ca}"')
            if self.cluster:
                lines.append("tls-cluster yes")
        if security.password is not None:
            lines.append(f'requirepass "{security.password}"')
        lines += [f"user {rule}" for rule in security.users]
        return "".join(f"{line}\n" for line in lines)
