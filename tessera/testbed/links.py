"""What the network does between two test hosts: latency, jitter, loss, bandwidth
(tc netem), or nothing at all (a partition).

Each host's eth0 gets a prio qdisc once: band 1 (the default for all traffic) is left
alone, and each peer that is shaped gets a band of its own, selected by a u32 filter on
the peer's address, with a netem qdisc under it. So shaping the decoder-0 <-> encoder-1
link slows exactly that pair, both ways (each side delays what it sends), and nothing
else.

A partition is netem with 100% loss on that pair: packets vanish silently, as when a
link or a switch dies, so callers see timeouts, not fast "unreachable" errors (which a
blackhole route would not give either, but a `prohibit` route would, and real
partitions rarely do).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.testbed.control import LinkShape
from tessera.testbed.hosts import Host, run

MAX_PEERS = 14  # prio has at most 16 bands; band 1 is the default one


def netem_args(link: LinkShape) -> list[str]:
    """`LinkShape(delay_ms=100, jitter_ms=10, loss_percent=1, rate_mbit=1000)` ->
    `delay 100ms 10ms loss 1% rate 1000mbit` (every number in tc's own units)."""
    args = ["delay", f"{link.delay_ms}ms"]
    if link.jitter_ms:
        args.append(f"{link.jitter_ms}ms")
    if link.loss_percent:
        args += ["loss", f"{link.loss_percent}%"]
    if link.rate_mbit:
        args += ["rate", f"{link.rate_mbit}mbit"]
    return args


PARTITIONED = LinkShape(loss_percent=100.0)


@dataclass
class HostLinks:
    """The shaped peers of one host."""

    host: Host
    bands: dict[str, int] = field(default_factory=dict)  # peer ip -> band (2..15)

    def _tc(self, *args: str, check: bool = True):
        return run("tc", "-n", self.host.namespace, *args, check=check)

    def set(self, peer_ip: str, link: LinkShape) -> None:
        if not self.bands:
            # 16 bands; every TOS priority maps to band 1 (class 1:1): unshaped.
            priomap = ["0"] * 16
            self._tc(
                "qdisc",
                "add",
                "dev",
                "eth0",
                "root",
                "handle",
                "1:",
                "prio",
                "bands",
                "16",
                "priomap",
                *priomap,
            )
        band = self.bands.get(peer_ip)
        verb = "change"
        if band is None:
            if len(self.bands) >= MAX_PEERS:
                raise ValueError(f"{self.host.name}: more than {MAX_PEERS} shaped peers")
            band = len(self.bands) + 2
            self.bands[peer_ip] = band
            verb = "add"
            self._tc(
                "filter",
                "add",
                "dev",
                "eth0",
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "ip",
                "dst",
                f"{peer_ip}/32",
                "flowid",
                f"1:{band}",
            )
        self._tc(
            "qdisc",
            verb,
            "dev",
            "eth0",
            "parent",
            f"1:{band}",
            "handle",
            f"{band}0:",
            "netem",
            *netem_args(link),
        )

    def clear(self, peer_ip: str) -> None:
        """Back to no delay, no loss (the band stays, empty of effect)."""
        if peer_ip in self.bands:
            self.set(peer_ip, LinkShape())

    def show(self) -> str:
        return self._tc("qdisc", "show", "dev", "eth0").stdout


class Links:
    """Shaping for every pair of hosts."""

    def __init__(self, hosts: dict[str, Host]) -> None:
        self.hosts = hosts
        self.by_host = {name: HostLinks(host) for name, host in hosts.items()}

    def shape(self, a: str, b: str, link: LinkShape) -> None:
        self.by_host[a].set(self.hosts[b].ip, link)
        self.by_host[b].set(self.hosts[a].ip, link)

    def unshape(self, a: str, b: str) -> None:
        self.by_host[a].clear(self.hosts[b].ip)
        self.by_host[b].clear(self.hosts[a].ip)
