"""A userspace Ethernet switch between the test hosts, with latency, jitter, loss and
bandwidth per pair of hosts: what `tc netem` on a bridge would do, for kernels built
without netem (sch_netem) or prio, such as the one these machines run.

    python -m tessera.testbed.wire --control SOCKET --port gateway=tsr1t0 --port ...

creates one TAP device per port (the caller then moves each into its host's network
namespace), prints "ready", and switches frames: it learns which port each MAC address
is behind, floods broadcast and unknown destinations, and holds each frame for its
pair's shape before writing it out. Shapes arrive as JSON lines on the control socket:

    {"a": "decoder-0", "b": "encoder-1", "delay_ms": 2.5, "jitter_ms": 0,
     "loss_percent": 0, "rate_mbit": 0}

apply to both directions, and reply "ok". A frame's release time is
`arrival + delay ± jitter`, never earlier than the pair's previous frame (no
reordering: TCP would take reordering as loss), and never earlier than the pair's link
is free at `rate_mbit` (a 64 KiB frame at 100 Mbit/s occupies it 5.2 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import heapq
import itertools
import json
import os
import random
import selectors
import socket
import struct
import sys
import time
from dataclasses import dataclass

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
MAX_FRAME_BYTES = 65_600  # MTU 65000 + Ethernet header, with room
BROADCAST_BIT = 0x01  # the group bit of a MAC address's first byte


@dataclass
class PairState:
    """One direction of one pair: its shape and when its link is free again."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    bits_per_s: float = 0.0
    last_release: float = 0.0
    link_free_at: float = 0.0

    @property
    def shaped(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss or self.bits_per_s)

    def release_time(self, now: float, num_bytes: int, rng: random.Random) -> float | None:
        """When a frame arriving `now` leaves, or None if it is lost."""
        if self.loss and rng.random() < self.loss:
            return None
        release = now + max(0.0, self.delay_s + rng.uniform(-self.jitter_s, self.jitter_s))
        if self.bits_per_s:
            self.link_free_at = max(now, self.link_free_at) + num_bytes * 8 / self.bits_per_s
            release = max(release, self.link_free_at)
        release = max(release, self.last_release)
        self.last_release = release
        return release


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


class Switch:
    def __init__(self, ports: dict[str, str], control_path: str, seed: int = 0) -> None:
        self.fds = {host: open_tap(tap) for host, tap in ports.items()}
        self.hosts = {fd: host for host, fd in self.fds.items()}
        self.mac_to_fd: dict[bytes, int] = {}
        self.pairs: dict[tuple[int, int], PairState] = {}
        self.pending: list[tuple[float, int, int, bytes]] = []  # (release, seq, fd, frame)
        self.seq = itertools.count()
        self.rng = random.Random(seed)
        self.selector = selectors.DefaultSelector()
        for fd in self.fds.values():
            self.selector.register(fd, selectors.EVENT_READ, "tap")
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control.bind(control_path)
        self.control.listen()
        self.selector.register(self.control, selectors.EVENT_READ, "accept")

    def run(self) -> None:
        while True:
            timeout = None
            if self.pending:
                timeout = max(0.0, self.pending[0][0] - time.monotonic())
            for key, _ in self.selector.select(timeout):
                if key.data == "tap":
                    self._read_frames(key.fd)
                elif key.data == "accept":
                    connection, _ = self.control.accept()
                    self.selector.register(connection, selectors.EVENT_READ, "control")
                else:
                    self._on_control(key.fileobj)
            self._release_due()

    def _read_frames(self, fd: int) -> None:
        while True:
            try:
                frame = os.read(fd, MAX_FRAME_BYTES)
            except BlockingIOError:
                return
            if len(frame) < 14:
                continue
            self.mac_to_fd[frame[6:12]] = fd
            destination = self.mac_to_fd.get(frame[0:6])
            if frame[0] & BROADCAST_BIT or destination is None:
                targets = [other for other in self.fds.values() if other != fd]
            else:
                targets = [destination]
            now = time.monotonic()
            for target in targets:
                self._forward(fd, target, frame, now)

    def _forward(self, source: int, target: int, frame: bytes, now: float) -> None:
        pair = self.pairs.get((source, target))
        if pair is None or not pair.shaped:
            _write(target, frame)
            return
        release = pair.release_time(now, len(frame), self.rng)
        if release is not None:
            heapq.heappush(self.pending, (release, next(self.seq), target, frame))

    def _release_due(self) -> None:
        now = time.monotonic()
        while self.pending and self.pending[0][0] <= now:
            _, _, target, frame = heapq.heappop(self.pending)
            _write(target, frame)

    def _on_control(self, connection: socket.socket) -> None:
        data = connection.recv(65536)
        if not data:
            self.selector.unregister(connection)
            connection.close()
            return
        for line in data.decode().splitlines():
            if line.strip():
                self._apply(json.loads(line))
        connection.sendall(b"ok\n")

    def _apply(self, shape: dict) -> None:
        a, b = self.fds[shape["a"]], self.fds[shape["b"]]
        for source, target in ((a, b), (b, a)):
            self.pairs[(source, target)] = PairState(
                delay_s=float(shape.get("delay_ms", 0)) / 1000,
                jitter_s=float(shape.get("jitter_ms", 0)) / 1000,
                loss=float(shape.get("loss_percent", 0)) / 100,
                bits_per_s=float(shape.get("rate_mbit", 0)) * 1e6,
            )


def _write(fd: int, frame: bytes) -> None:
    # A full or vanished device drops the frame, as a congested switch would.
    with contextlib.suppress(OSError):
        os.write(fd, frame)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--control", required=True, help="Unix socket path for shapes")
    parser.add_argument("--port", action="append", default=[], help="host=tapname")
    parser.add_argument("--seed", type=int, default=0, help="seed of the loss and jitter draws")
    args = parser.parse_args(argv)
    ports = dict(item.split("=", 1) for item in args.port)
    switch = Switch(ports, args.control, args.seed)
    print("ready", flush=True)
    try:
        switch.run()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
