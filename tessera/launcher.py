"""`tessera serve`: the whole system as separate processes on localhost.

Starts one encoder, one decoder and the gateway (each exactly as `tessera encoder|decoder|
gateway` would, which is how Kubernetes runs them), waits until every one reports SERVING
on grpc.health.v1, prints where to connect, and stops them all on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Flags `serve` sets on the services itself; they cannot be passed through.
_OWN_FLAGS = {"--model", "--port", "--host", "--encoders", "--decoders"}


@dataclass
class Child:
    name: str
    address: str
    process: subprocess.Popen


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def route_flags(
    extra: list[str], parsers: dict[str, argparse.ArgumentParser]
) -> dict[str, list[str]]:
    """Sends each extra flag (with its value) to every service whose parser knows it.

    `["--max-chunk-tokens", "16", "--device=cpu"]` -> decoder gets the first, encoder and
    decoder get `--device=cpu`.
    """
    routed: dict[str, list[str]] = {name: [] for name in parsers}
    index = 0
    while index < len(extra):
        token = extra[index]
        flag = token.split("=", 1)[0]
        if flag in _OWN_FLAGS:
            raise SystemExit(f"tessera serve sets {flag} itself; use serve's own options")
        owners = [name for name, p in parsers.items() if flag in p._option_string_actions]
        if not owners:
            raise SystemExit(f"no service takes {flag}; see tessera encoder|decoder|gateway --help")
        action = parsers[owners[0]]._option_string_actions[flag]
        takes_value = action.nargs != 0 and "=" not in token
        group = extra[index : index + 1 + int(takes_value)]
        for name in owners:
            routed[name] += group
        index += len(group)
    return routed


def wait_healthy(children: list[Child], timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    for child in children:
        with grpc.insecure_channel(child.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                if child.process.poll() is not None:
                    raise SystemExit(
                        f"the {child.name} exited with code {child.process.returncode}"
                    )
                try:
                    status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"the {child.name} was not ready after {timeout_seconds:.0f}s")
                time.sleep(0.2)


def start_child(name: str, args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tessera.cli", name, *args])


def stop_children(children: list[Child], grace_seconds: float = 15.0) -> None:
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()


def serve_all(
    model: str, host: str, port: int, routed: dict[str, list[str]], ready_timeout: float
) -> None:
    encoder = f"{host}:{free_port(host)}"
    decoder = f"{host}:{free_port(host)}"
    gateway = f"{host}:{port}"
    common = ["--model", model, "--host", host]
    children: list[Child] = []
    stop = {"requested": False}

    def on_signal(signum, frame):
        stop["requested"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for name, address, extra in [
            ("encoder", encoder, routed["encoder"]),
            ("decoder", decoder, routed["decoder"]),
            (
                "gateway",
                gateway,
                ["--encoders", encoder, "--decoders", decoder, *routed["gateway"]],
            ),
        ]:
            args = [*common, "--port", address.rsplit(":", 1)[1], *extra]
            children.append(Child(name, address, start_child(name, args)))
        wait_healthy(children, ready_timeout)
        print_ready(gateway, model)
        while not stop["requested"]:
            for child in children:
                if child.process.poll() is not None:
                    raise SystemExit(
                        f"the {child.name} exited with code {child.process.returncode}"
                    )
            time.sleep(0.5)
    finally:
        stop_children(children)


def print_ready(gateway: str, model: str) -> None:
    tessera = Path(sys.executable).with_name("tessera")
    command = str(tessera) if tessera.exists() else "tessera"
    print(
        f"\nTessera is ready.\n"
        f"  gateway (gRPC): {gateway}   model: {model}\n"
        f'  try:  {command} generate --server {gateway} --image some.png "Describe the image."\n'
        f"  stop: Ctrl-C\n",
        flush=True,
    )
