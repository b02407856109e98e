"""`tessera serve --encoders 3 --decoders 2 --redis-url URL`: the cluster's shape on
loopback. It answers exactly like generate(), computes each image once across the
encoders, and keeps answering while an encoder process is killed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tessera.client import Client, Message
from tessera.launcher import free_port
from tessera.testbed.redis_server import PrivateRedis
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

MAX_NEW_TOKENS = 5
READY_SECONDS = 240
REPLICA_LINE = re.compile(r"^\s+((?:encoder|decoder)-\d+|gateway)\s+(\S+)\s+pid (\d+)")

pytestmark = pytest.mark.slow


@dataclass
class Replica:
    name: str
    address: str
    pid: int


class Serve:
    """A running `tessera serve`, its output collected by a thread."""

    def __init__(self, args: list[str]):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tessera.cli", "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TESSERA_LOG_LEVEL": "INFO"},
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line)
            if line.strip() == "stop: Ctrl-C":
                self.ready.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self) -> list[Replica]:
        deadline = time.monotonic() + READY_SECONDS
        while not self.ready.wait(0.5):
            assert self.process.poll() is None, f"serve exited early:\n{self.output[-5000:]}"
            assert time.monotonic() < deadline, f"serve not ready:\n{self.output[-5000:]}"
        return [
            Replica(m.group(1), m.group(2), int(m.group(3)))
            for m in map(REPLICA_LINE.match, self.lines)
            if m
        ]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            self.reader.join(10)


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (in parentheses) may contain spaces: fields after it are fixed.
    return int(stat.rsplit(")", 1)[1].split()[1])


def encoder_stats(address: str) -> encoder_pb2.EncoderStats:
    with grpc.insecure_channel(address) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def chat(seed: int) -> list[tuple[str, list[str | bytes]]]:
    return [("user", [noise_image(seed, 24 + seed % 17, 30), "What is this?"])]


def run_load(gateway: str, reference, seeds: list[int], during=None) -> None:
    """Requests from 3 client threads; `during()` runs once they are under way. Every
    request must complete and equal generate()."""
    results: dict[int, list[int]] = {}
    errors: list[str] = []
    started = threading.Event()

    def worker(part: list[int]) -> None:
        with Client(gateway, timeout_seconds=60) as client:
            for seed in part:
                started.set()
                messages = [Message(role, parts) for role, parts in chat(seed)]
                sampling = common_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS)
                try:
                    results[seed] = client.complete(messages, sampling, 8).token_ids
                except grpc.RpcError as error:
                    errors.append(f"seed {seed}: {error.code().name}: {error.details()}")

    threads = [threading.Thread(target=worker, args=(seeds[i::3],)) for i in range(3)]
    for thread in threads:
        thread.start()
    if during is not None:
        assert started.wait(60)
        time.sleep(0.3)
        during()
    for thread in threads:
        thread.join(180)
    assert not errors, errors
    for seed in seeds:
        assert_greedy_match(results[seed], reference.generate(chat(seed), MAX_NEW_TOKENS))


def test_serve_three_encoders_two_decoders_with_redis(demo_model_dir, reference, tmp_path):
    redis = PrivateRedis(tmp_path)
    redis.start()
    port = free_port()
    serve = Serve(
        [
            "--model",
            str(demo_model_dir),
            "--port",
            str(port),
            "--encoders",
            "3",
            "--decoders",
            "2",
            "--redis-url",
            redis.url,
            "--max-chunk-tokens",
            "16",
        ]
    )
    try:
        replicas = serve.wait_ready()
        encoders = [r for r in replicas if r.name.startswith("encoder-")]
        decoders = [r for r in replicas if r.name.startswith("decoder-")]
        assert len(encoders) == 3 and len(decoders) == 2, serve.output[-3000:]
        for replica in replicas:
            assert parent_pid(replica.pid) == serve.process.pid, replica
        # The gateway was given every replica (its start line lists them).
        (start,) = re.findall(r"tessera gateway \S+ ready: .*", serve.output)
        assert f"encoders={','.join(r.address for r in encoders)} " in start
        assert f"decoders={','.join(r.address for r in decoders)} " in start
        for encoder in encoders:
            assert encoder_stats(encoder.address).redis_enabled, encoder

        gateway = f"127.0.0.1:{port}"
        first = list(range(1300, 1306))
        run_load(gateway, reference, first)
        computed = sum(encoder_stats(e.address).num_items_computed for e in encoders)
        assert computed == len(first), "each image is encoded once across the fleet"
        with redis.client() as client:
            assert len(client.keys("tessera:emb:*")) == len(first), "shared through Redis"

        victim = max(encoders, key=lambda e: encoder_stats(e.address).num_items_computed)
        run_load(
            gateway,
            reference,
            list(range(1310, 1322)) + first[:3],
            during=lambda: os.kill(victim.pid, signal.SIGKILL),
        )
        assert serve.process.poll() is None, "serve keeps running with 2 of 3 encoders"
        # Answers still come after the gateway has set the dead replica aside.
        run_load(gateway, reference, list(range(1330, 1336)))
        deadline = time.monotonic() + 60  # a bound, not a speed
        while f"the {victim.name} ({victim.address}, pid {victim.pid}) exited" not in (
            serve.output
        ):
            assert time.monotonic() < deadline, serve.output[-3000:]
            time.sleep(0.2)
    finally:
        code = serve.stop()
        redis.kill()
    assert code == 0, serve.output[-3000:]
