"""The fleet on test hosts: every process in a network namespace of its own, replicas
found through a real DNS server, links shaped or cut with tc netem.

    python -m tessera.testbed.netfleet [--model M] [--encoders 3] [--decoders 2]

(`make fleet-net`) starts it, prints each host and one example request, and removes
everything on Ctrl-C. Needs root, iproute2 and dnsmasq (`unavailable_reason()` says
what is missing).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from tessera.testbed.control import LinkShape
from tessera.testbed.dns import DnsServer
from tessera.testbed.fleet import Fleet, FleetPlan, redis_command, role_of, service_command
from tessera.testbed.hosts import HostNetwork, remove_stale, run, unavailable_reason
from tessera.testbed.links import PARTITIONED, Links
from tessera.testbed.procs import Proc, interrupt_on_sigterm

# Every replica of a role listens on the same port of its own address, as pods do.
PORTS = {"redis": 6379, "encoder": 50052, "decoder": 50053, "gateway": 50051}
HTTP_PORT = 8000
MAX_DNS_START_SECONDS = 30.0


def dns_names(network: HostNetwork, plan: FleetPlan) -> dict[str, list[str]]:
    """Each host by its own name, and "encoders"/"decoders" answering every replica."""
    names = {name: [host.ip] for name, host in network.hosts.items()}
    for role in ("encoder", "decoder"):
        names[f"{role}s"] = [h.ip for n, h in network.hosts.items() if role_of(n) == role]
    return names


def routes(role: str) -> list[str]:
    encoders = f"dns:///encoders:{PORTS['encoder']}"
    return {
        "encoder": ["--redis-url", f"redis://redis:{PORTS['redis']}/0"],
        "decoder": ["--encoders", encoders],
        "gateway": [
            "--encoders",
            encoders,
            "--decoders",
            f"dns:///decoders:{PORTS['decoder']}",
            "--http-port",
            str(HTTP_PORT),
        ],
    }[role]


class NetFleet(Fleet):
    def __init__(self, plan: FleetPlan) -> None:
        super().__init__(plan)
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"test hosts cannot be made here: {reason}")
        remove_stale()
        self.network = HostNetwork([*plan.names(), "dns"], self.work_dir)
        self.http_port = HTTP_PORT
        dns_host = self.network.hosts["dns"]
        self.dns = DnsServer(dns_host.namespace, dns_host.ip, self.work_dir)
        self.links = Links(self.network.control_path)
        for name in plan.names():
            host = self.network.hosts[name]
            role = role_of(name)
            port = PORTS[role]
            if role == "redis":
                command, kind = redis_command(host.ip, port, self.work_dir), "redis"
            else:
                command, kind = service_command(plan, name, host.ip, port, routes(role)), "grpc"
            self.procs[name] = Proc(
                name, command, f"{host.ip}:{port}", kind, host.namespace, self.work_dir
            )

    def start_all(self) -> None:
        self.network.create()
        self.network.set_resolver(self.dns.ip)
        self.dns.start(dns_names(self.network, self.plan))
        self._wait_resolves("gateway", "redis")
        super().start_all()

    def resolve(self, from_name: str, name: str) -> list[str]:
        """What `name` resolves to from `from_name`'s host (IPv4 addresses, sorted)."""
        namespace = self.network.hosts[from_name].namespace
        found = run("ip", "netns", "exec", namespace, "getent", "ahostsv4", name, check=False)
        return sorted({line.split()[0] for line in found.stdout.splitlines() if line.strip()})

    def _wait_resolves(self, from_name: str, name: str) -> None:
        deadline = time.monotonic() + MAX_DNS_START_SECONDS
        while not self.resolve(from_name, name):
            if time.monotonic() > deadline or not self.dns.proc.running():
                raise RuntimeError(f"dnsmasq does not answer:\n{self.dns.proc.tail()}")
            time.sleep(0.1)

    def host_ip(self, name: str) -> str:
        return self.network.hosts[name].ip

    # -- network faults --
    def partition(self, a: str, b: str) -> None:
        self.links.shape(a, b, PARTITIONED)

    def heal(self, a: str, b: str) -> None:
        self.links.unshape(a, b)

    def shape(self, a: str, b: str, link: LinkShape) -> None:
        self.links.shape(a, b, link)

    def unshape(self, a: str, b: str) -> None:
        self.links.unshape(a, b)

    def set_dns(self, name: str, addresses: list[str]) -> None:
        """Returns once the DNS server answers the new addresses (it rereads its hosts
        directory on a file event, a moment after the write)."""
        self.dns.set(name, addresses)
        deadline = time.monotonic() + MAX_DNS_START_SECONDS
        while self.resolve("gateway", name) != sorted(addresses):
            if time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq still answers the old {name}:\n{self.dns.proc.tail()}")
            time.sleep(0.05)

    def run_in(self, name: str, *command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """A command on `name`'s host (probes in tests: ping, getent, a TCP connect)."""
        namespace = self.network.hosts[name].namespace
        return subprocess.run(
            ["ip", "netns", "exec", namespace, *command],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        try:
            super().stop()
            self.dns.proc.terminate(grace_seconds=5)
        finally:
            self.network.remove()

    def describe(self) -> str:
        return "\n".join(
            f"  {name:<10} {host.ip:<14} netns {host.namespace:<22}"
            f" {self.procs[name].address if name in self.procs else 'dns :53'}"
            for name, host in self.network.hosts.items()
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tessera.testbed.netfleet",
        description="Run a Tessera fleet on test hosts (network namespaces, real DNS).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", default="", help="checkpoint; a generated demo if empty")
    parser.add_argument("--encoders", type=int, default=3, help="encoder hosts")
    parser.add_argument("--decoders", type=int, default=2, help="decoder hosts")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"fleet-net: test hosts cannot be made here: {reason}")
    model = args.model or str(_demo_model())
    fleet = NetFleet(FleetPlan(model, args.decoders, args.encoders))
    interrupt_on_sigterm()
    try:
        print("fleet-net: starting hosts and services (a minute on 2 cores)...", flush=True)
        fleet.start_all()
        gateway = fleet.gateway_address
        print(
            f"\nTessera is ready on test hosts.\n{fleet.describe()}\n"
            f"  gateway (gRPC): {gateway}   OpenAI API: {fleet.gateway_http}/v1\n"
            f"  try:  curl {fleet.gateway_http}/v1/chat/completions -H 'Content-Type: "
            f'application/json\' -d \'{{"messages":[{{"role":"user","content":'
            f'"Hello"}}],"max_tokens":8}}\'\n'
            f"  shape a link:  NetFleet.shape(a, b, LinkShape(...)) (tessera.testbed)\n"
            f"Ctrl-C stops everything and removes the hosts.",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("fleet-net: stopping", flush=True)
    finally:
        fleet.stop()


def _demo_model() -> Path:
    from tessera.demo_models import make_demo_model

    return make_demo_model(Path(tempfile.mkdtemp(prefix="tessera-demo-")) / "tiny", seed=0)


if __name__ == "__main__":
    main()
