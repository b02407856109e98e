"""Test hosts: one network namespace per host, each joined to one bridge by a veth
pair, addresses in a private /24, the bridge's own address in the root namespace so
the harness (the "client") reaches every host.

    root ns: bridge tb<id> 10.211.N.1/24
      ├─ veth ─ ns tsr<id>-gateway   eth0 10.211.N.10
      ├─ veth ─ ns tsr<id>-decoder-0 eth0 10.211.N.11
      └─ ...

Everything made is named with this instance's id, removed by `remove()`, and found
again by `remove_stale()` when a run died without cleaning up.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NETNS_ETC = Path("/etc/netns")  # `ip netns exec` bind-mounts <dir>/<ns>/resolv.conf
PREFIX = "tsr"
FIRST_HOST_INDEX = 10


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "dnsmasq"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"`{tool}` is not installed (iproute2, dnsmasq-base)"
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
        subnet = ipaddress.IPv4Network(f"10.211.{third}.0/24")
        if f" 10.211.{third}." not in used:
            return subnet
    raise RuntimeError("no free 10.211.N.0/24 subnet")


@dataclass(frozen=True)
class Host:
    name: str  # e.g. "decoder-0"
    namespace: str
    ip: str


class HostNetwork:
    """The bridge and one namespace per host name."""

    def __init__(self, host_names: list[str]) -> None:
        self.id = f"{os.getpid() % 100000}"
        self.bridge = f"tb{self.id}"
        self.subnet = free_subnet()
        addresses = list(self.subnet.hosts())
        self.gateway_ip = str(addresses[0])  # the bridge: the root namespace's address
        self.hosts = {
            name: Host(name, f"{PREFIX}{self.id}-{name}", str(addresses[FIRST_HOST_INDEX + i]))
            for i, name in enumerate(host_names)
        }

    def create(self) -> None:
        prefix_len = self.subnet.prefixlen
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway_ip}/{prefix_len}", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for index, host in enumerate(self.hosts.values()):
            outside, inside = f"tv{self.id}h{index}", f"tv{self.id}n{index}"
            run("ip", "netns", "add", host.namespace)
            run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            run("ip", "link", "set", inside, "netns", host.namespace)
            run("ip", "link", "set", outside, "master", self.bridge, "up")
            ns = ("ip", "-n", host.namespace)
            run(*ns, "link", "set", inside, "name", "eth0")
            run(*ns, "addr", "add", f"{host.ip}/{prefix_len}", "dev", "eth0")
            run(*ns, "link", "set", "eth0", "up")
            run(*ns, "link", "set", "lo", "up")

    def set_resolver(self, nameserver_ip: str) -> None:
        """Every host resolves names through `nameserver_ip` (and only it)."""
        for host in self.hosts.values():
            directory = NETNS_ETC / host.namespace
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "resolv.conf").write_text(f"nameserver {nameserver_ip}\n")

    def remove(self) -> None:
        for host in self.hosts.values():
            run("ip", "netns", "del", host.namespace, check=False)  # its veth goes with it
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        run("ip", "link", "del", self.bridge, check=False)


def remove_stale() -> list[str]:
    """Removes namespaces, /etc/netns dirs and bridges of runs whose process is gone;
    returns what it removed."""
    removed = []
    listing = run("ip", "netns", "list", check=False).stdout.split()
    for namespace in [n for n in listing if n.startswith(PREFIX) and "-" in n]:
        owner = namespace[len(PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            run("ip", "netns", "del", namespace, check=False)
            shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
            removed.append(namespace)
    links = run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout
    for line in links.splitlines():
        bridge = line.split(":")[1].strip()
        if bridge.startswith("tb") and bridge[2:].isdigit() and not _alive(int(bridge[2:])):
            run("ip", "link", "del", bridge, check=False)
            removed.append(bridge)
    return removed


def _alive(pid_mod: int) -> bool:
    # Names carry pid % 100000; on this scale a live pid with that remainder is the owner.
    return any(int(entry) % 100000 == pid_mod for entry in os.listdir("/proc") if entry.isdigit())
