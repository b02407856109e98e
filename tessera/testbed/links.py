"""What the network does between two test hosts: latency, jitter, loss, bandwidth, or
nothing at all (a partition: every frame lost, silently, as when a link dies, so
callers see timeouts rather than fast "unreachable" errors).

The kernels these machines run are built without tc's netem and prio qdiscs, so the
shaping is done by the userspace switch every host is plugged into
(tessera.testbed.wire), told over its control socket.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict

from tessera.testbed.control import LinkShape

PARTITIONED = LinkShape(loss_percent=100.0)


class Links:
    def __init__(self, control_path: str) -> None:
        self.control_path = control_path
        self.shapes: dict[frozenset[str], LinkShape] = {}

    def shape(self, a: str, b: str, link: LinkShape) -> None:
        """Both directions between hosts `a` and `b` (host names, "root" for the
        harness's own)."""
        self._send({"a": a, "b": b, **asdict(link)})
        self.shapes[frozenset((a, b))] = link

    def unshape(self, a: str, b: str) -> None:
        self.shape(a, b, LinkShape())
        del self.shapes[frozenset((a, b))]

    def _send(self, message: dict) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as control:
            control.settimeout(10)
            control.connect(self.control_path)
            control.sendall(json.dumps(message).encode() + b"\n")
            if control.recv(16).strip() != b"ok":
                raise RuntimeError(f"the wire refused {message}")
