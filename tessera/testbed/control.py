"""What the chaos and soak harnesses need from a running fleet, whatever hosts it is on.

A fleet is a gateway, decoders, encoders and one Redis, each process known by a role
name: "gateway", "decoder-0", "decoder-1", "encoder-0", "encoder-1", "encoder-2",
"redis". Process faults work on every fleet; network faults (`partition`, `shape`,
`set_dns`) need hosts of their own and raise `NetworkFaultsUnsupported` on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class NetworkFaultsUnsupported(RuntimeError):
    """The fleet's processes share one network stack (loopback): links cannot differ."""


@dataclass(frozen=True)
class LinkShape:
    """tc netem settings for the traffic between two hosts, both directions.
    `rate_mbit` 0 means no bandwidth limit."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    rate_mbit: float = 0.0


class FleetControl(Protocol):
    @property
    def gateway_address(self) -> str:
        """host:port of the gateway's gRPC API, reachable from the harness's process."""

    @property
    def gateway_http(self) -> str:
        """Base URL of the gateway's HTTP API (http://host:port)."""

    @property
    def redis_url(self) -> str:
        """redis:// URL of the fleet's Redis, reachable from the harness's process."""

    def names(self, role: str) -> list[str]:
        """Process names of a role: `names("encoder")` -> ["encoder-0", ...]."""

    def address(self, name: str) -> str:
        """host:port of a process's gRPC API (Redis: its host:port)."""

    def pid(self, name: str) -> int:
        """Process id of a running process."""

    def kill(self, name: str) -> None:
        """SIGKILL, and reaps it."""

    def terminate(self, name: str) -> int:
        """SIGTERM (a decoder drains), waits for the exit; returns its code."""

    def pause(self, name: str) -> None:
        """SIGSTOP."""

    def resume(self, name: str) -> None:
        """SIGCONT."""

    def restart(self, name: str) -> None:
        """Starts a stopped or killed process again on its old address, as Kubernetes
        restarts a pod; returns once it is SERVING (Redis: answers PING)."""

    def partition(self, a: str, b: str) -> None:
        """Drops every packet between the hosts of `a` and `b` (both directions)."""

    def heal(self, a: str, b: str) -> None:
        """Undoes `partition(a, b)`."""

    def shape(self, a: str, b: str, link: LinkShape) -> None:
        """Sets netem on the link between the hosts of `a` and `b` (replaces any)."""

    def unshape(self, a: str, b: str) -> None:
        """Removes what `shape(a, b, ...)` set."""

    def set_dns(self, name: str, addresses: list[str]) -> None:
        """Makes the DNS name (e.g. "encoders") answer `addresses` (IPs) from now on."""

    def stop(self) -> None:
        """Stops every process and removes whatever the fleet made."""
