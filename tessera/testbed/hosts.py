"""Test hosts: one network namespace per host, each with one interface (eth0) on a
userspace switch (tessera.testbed.wire) that can delay, drop and rate-limit the traffic
of any pair of hosts; addresses in a private /24, the switch's root port holding the
first address so the harness (the "client") reaches every host.

    root ns: tt<id>r 10.211.N.1/24 ─┐
    ns tsr<id>-gateway   eth0 10.211.N.10 ─┤ wire (userspace switch)
    ns tsr<id>-decoder-0 eth0 10.211.N.11 ─┤
    ...

Everything made is named with this instance's id, removed by `remove()`, and found
again by `remove_stale()` when a run died without cleaning up.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")  # `ip netns exec` bind-mounts <dir>/<ns>/resolv.conf
PREFIX = "tsr"
FIRST_HOST_INDEX = 10
MTU = 65000  # fewer, larger frames through the userspace switch
MAX_WIRE_START_SECONDS = 30.0


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "dnsmasq", "getent"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"`{tool}` is not installed (iproute2, dnsmasq-base, libc-bin)"
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun (TAP devices)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.211.N.0/24 no interface here uses."""
    used = run("ip", "-4", "-o", "addr", "show").stdout
    for third in range(256):
        if f" 10.211.{third}." not in used:
            return ipaddress.IPv4Network(f"10.211.{third}.0/24")
    raise RuntimeError("no free 10.211.N.0/24 subnet")


@dataclass(frozen=True)
class Host:
    name: str  # e.g. "decoder-0"
    namespace: str
    ip: str
    tap: str


class HostNetwork:
    """The switch and one namespace per host name."""

    def __init__(self, host_names: list[str], work_dir: Path) -> None:
        self.id = f"{os.getpid() % 100000}"
        self.subnet = free_subnet()
        addresses = list(self.subnet.hosts())
        self.root_ip = str(addresses[0])
        self.root_tap = f"tt{self.id}r"
        self.hosts = {
            name: Host(
                name,
                f"{PREFIX}{self.id}-{name}",
                str(addresses[FIRST_HOST_INDEX + i]),
                f"tt{self.id}h{i}",
            )
            for i, name in enumerate(host_names)
        }
        self.control_path = str(work_dir / "wire.sock")
        self.wire_log = work_dir / "wire.log"
        self.wire: subprocess.Popen | None = None

    def create(self) -> None:
        self._start_wire()
        prefix_len = self.subnet.prefixlen
        _configure(("ip",), self.root_tap, f"{self.root_ip}/{prefix_len}")
        for host in self.hosts.values():
            run("ip", "netns", "add", host.namespace)
            run("ip", "link", "set", host.tap, "netns", host.namespace)
            ns = ("ip", "-n", host.namespace)
            run(*ns, "link", "set", host.tap, "name", "eth0")
            _configure(ns, "eth0", f"{host.ip}/{prefix_len}")
            run(*ns, "link", "set", "lo", "up")

    def _start_wire(self) -> None:
        ports = [f"root={self.root_tap}"] + [f"{h.name}={h.tap}" for h in self.hosts.values()]
        command = [sys.executable, "-m", "tessera.testbed.wire", "--control", self.control_path]
        for port in ports:
            command += ["--port", port]
        self.wire = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self.wire_log.open("w"), text=True
        )
        line = self.wire.stdout.readline()  # "ready" once every TAP exists
        if line.strip() != "ready":
            raise RuntimeError(f"the wire did not start:\n{self.wire_log.read_text()[-2000:]}")

    def set_resolver(self, nameserver_ip: str) -> None:
        """Every host resolves names through `nameserver_ip` (and only it)."""
        for host in self.hosts.values():
            directory = NETNS_ETC / host.namespace
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "resolv.conf").write_text(f"nameserver {nameserver_ip}\n")

    def remove(self) -> None:
        for host in self.hosts.values():
            run("ip", "netns", "del", host.namespace, check=False)
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        if self.wire is not None:
            self.wire.kill()  # its TAP devices go with it
            self.wire.wait()


def _configure(ip_command: tuple[str, ...], device: str, address: str) -> None:
    run(*ip_command, "addr", "add", address, "dev", device)
    run(*ip_command, "link", "set", device, "mtu", str(MTU), "up")


def remove_stale() -> list[str]:
    """Removes the namespaces and /etc/netns dirs of runs whose process is gone; returns
    what it removed."""
    removed = []
    listing = run("ip", "netns", "list", check=False).stdout.split()
    for namespace in [n for n in listing if n.startswith(PREFIX) and "-" in n]:
        owner = namespace[len(PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            run("ip", "netns", "del", namespace, check=False)
            shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
            removed.append(namespace)
    return removed


def _alive(pid_mod: int) -> bool:
    # Names carry pid % 100000; on this scale a live pid with that remainder is the owner.
    return any(int(entry) % 100000 == pid_mod for entry in os.listdir("/proc") if entry.isdigit())
