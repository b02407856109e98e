"""A real DNS server for the test hosts: dnsmasq in a namespace of its own, answering
names from a hosts directory it watches, so answers can change while the fleet serves
(as a Kubernetes headless Service's do when pods come and go).

Names are single labels: "encoders" answers every encoder's address, as
`dns:///encoders:PORT` expects; "redis", "encoder-0", ... answer one each.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tessera.testbed.procs import Proc

TTL_SECONDS = 1  # clients here do not cache; a short TTL keeps any cache honest


def dnsmasq_command(listen_ip: str, hosts_dir: Path) -> list[str]:
    return [
        shutil.which("dnsmasq") or "/usr/sbin/dnsmasq",
        "--keep-in-foreground",
        "--no-resolv",  # never forwards: test traffic stays on the test hosts
        "--no-hosts",
        f"--hostsdir={hosts_dir}",  # reread on every change (inotify)
        f"--listen-address={listen_ip}",
        "--bind-interfaces",
        f"--local-ttl={TTL_SECONDS}",
        "--log-facility=-",
        "--user=root",
        "--pid-file=",
    ]


def hosts_text(names: dict[str, list[str]]) -> str:
    """`{"encoders": ["10.0.0.1", "10.0.0.2"]}` -> one `ip name` line per address."""
    return "".join(f"{ip} {name}\n" for name, ips in sorted(names.items()) for ip in ips)


class DnsServer:
    def __init__(self, namespace: str, ip: str, directory: Path) -> None:
        self.ip = ip
        self.hosts_dir = directory / "dns-hosts"
        self.hosts_dir.mkdir(parents=True, exist_ok=True)
        self.names: dict[str, list[str]] = {}
        self.proc = Proc(
            "dns",
            dnsmasq_command(ip, self.hosts_dir),
            f"{ip}:53",
            kind="process",
            namespace=namespace,
            log_path=directory,
        )

    def start(self, names: dict[str, list[str]]) -> None:
        self.set_all(names)
        self.proc.start()

    def set(self, name: str, ips: list[str]) -> None:
        self.set_all({**self.names, name: list(ips)})

    def set_all(self, names: dict[str, list[str]]) -> None:
        """Replaces every answer at once: the hosts file is replaced by a rename, which
        dnsmasq sees as one change (it drops the file's old records, reads the new)."""
        staged = self.hosts_dir.parent / "dns-hosts.staged"
        staged.write_text(hosts_text(names))
        os.replace(staged, self.hosts_dir / "hosts")
        self.names = {name: list(ips) for name, ips in names.items()}
