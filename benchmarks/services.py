"""The service arms: real encoder, decoder and gateway processes on loopback, driven by
closed-loop client threads or an open-loop Poisson schedule, with their counters read
through GetStats and their peak memory and CPU time through /proc."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.outcome import Outcome
from benchmarks.workloads import BenchRequest
from tessera.client import Client, Message
from tessera.cpus import usable_cpus
from tessera.launcher import torch_threads_flag
from tessera.testbed.cluster import Cluster
from tessera.tls import TlsFiles, sync_channel, tls_args
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc, encoder_pb2, encoder_pb2_grpc


def reset_peak_rss(pid: int | str) -> None:
    """Restarts the kernel's peak-RSS mark (VmHWM) of a process."""
    # Where not permitted, the peak since the process started is reported instead.
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_rss_mb(pid: int | str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int | str) -> float:
    """User plus system CPU time a process has used, every thread of it."""
    # /proc/PID/stat: fields 14 and 15 (utime, stime) after the parenthesised name.
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def encoder_stats(address: str, tls: TlsFiles | None = None) -> encoder_pb2.EncoderStats:
    with sync_channel(address, tls) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        return stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)


def decoder_stats(address: str, tls: TlsFiles | None = None) -> decoder_pb2.DecoderStats:
    with sync_channel(address, tls) as channel:
        stub = decoder_pb2_grpc.DecoderServiceStub(channel)
        return stub.GetStats(decoder_pb2.GetDecoderStatsRequest(), timeout=10)


def timed_request(client: Client, request: BenchRequest) -> Outcome:
    """One streamed request; times are taken as tokens arrive at the client."""
    sampling = common_pb2.SamplingParams(max_tokens=request.max_tokens)
    messages = [Message(role, parts) for role, parts in request.messages]
    started = time.perf_counter()
    times: list[float] = []
    for response in client.stream(
        messages, sampling, max_chunk_tokens=request.chunk_tokens, cache_salt=request.cache_salt
    ):
        if response.HasField("delta"):
            now = time.perf_counter()
            times += [now] * len(response.delta.token_ids)
            continue
        done = response.finished
        return Outcome.from_times(
            token_ids=list(done.token_ids),
            prompt_token_ids=list(done.prompt_token_ids),
            started=started,
            token_times=times,
            embedding_bytes=done.stats.num_embedding_bytes,
            cached_prompt_tokens=done.stats.decoder.num_cached_prompt_tokens,
            fetch_wait_ms=done.stats.decoder.fetch_wait_ms,
            items_computed=done.stats.num_items_computed,
        )
    raise RuntimeError("the gateway closed the stream without a final message")


@dataclass
class ServiceCounters:
    """What the arm's services did between two snapshots."""

    encoder_passes: int = 0
    forward_seconds: float = 0.0
    fetch_wait_seconds: float = 0.0
    peak_rss_mb: dict[str, float] = field(default_factory=dict)
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # by role


@dataclass
class ServiceArm:
    """One deployment: `encoders`, `decoder` and `gateway` name processes of `cluster`."""

    name: str
    cluster: Cluster
    encoders: list[str]
    decoder: str
    gateway: str
    tls: TlsFiles | None = None  # the client's files, when the services use mutual TLS
    _client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.cluster.address(self.gateway), tls=self.tls)
        return self._client

    def processes(self) -> dict[str, int]:
        names = {"gateway": self.gateway, "decoder": self.decoder}
        names |= {f"encoder{i or ''}": e for i, e in enumerate(self.encoders)}
        return {role: self.cluster.child(n).process.pid for role, n in names.items()}

    def snapshot(self) -> ServiceCounters:
        processes = self.processes()
        decoder = decoder_stats(self.cluster.address(self.decoder), self.tls)
        return ServiceCounters(
            encoder_passes=sum(
                encoder_stats(self.cluster.address(e), self.tls).num_items_computed
                for e in self.encoders
            ),
            forward_seconds=decoder.forward_seconds,
            fetch_wait_seconds=decoder.fetch_wait_seconds,
            peak_rss_mb={role: peak_rss_mb(pid) for role, pid in processes.items()},
            cpu_seconds={role: cpu_seconds(pid) for role, pid in processes.items()},
        )

    def reset_peaks(self) -> None:
        for pid in self.processes().values():
            reset_peak_rss(pid)

    def since(self, before: ServiceCounters) -> ServiceCounters:
        after = self.snapshot()
        return ServiceCounters(
            encoder_passes=after.encoder_passes - before.encoder_passes,
            forward_seconds=after.forward_seconds - before.forward_seconds,
            fetch_wait_seconds=after.fetch_wait_seconds - before.fetch_wait_seconds,
            peak_rss_mb=after.peak_rss_mb,
            cpu_seconds={
                role: seconds - before.cpu_seconds.get(role, 0.0)
                for role, seconds in after.cpu_seconds.items()
            },
        )

    def run(
        self, requests: Sequence[BenchRequest], concurrency: int
    ) -> tuple[list[Outcome], float]:
        """Closed loop: `concurrency` clients, each sends its next request when its last
        one finished. Returns the outcomes in request order and the wall time."""
        client = self.client
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            outcomes = list(pool.map(lambda r: timed_request(client, r), requests))
        return outcomes, time.perf_counter() - started

    def run_open_loop(
        self, requests: Sequence[BenchRequest], arrivals: Sequence[float]
    ) -> tuple[list[Outcome], float]:
        """Open loop: request i is sent at `arrivals[i]` seconds whatever is running."""
        client = self.client
        outcomes: list[Outcome | None] = [None] * len(requests)
        errors: list[BaseException] = []
        started = time.perf_counter()

        def send(index: int) -> None:
            delay = started + arrivals[index] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                outcomes[index] = timed_request(client, requests[index])
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return [o for o in outcomes if o is not None], time.perf_counter() - started

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def shared_host_threads(service: str, flags: Sequence[str], num_replicas: int = 1) -> list[str]:
    """The --torch-threads `tessera serve` gives `service` on this host, unless `flags`
    set it."""
    return torch_threads_flag(service, usable_cpus(), num_replicas, flags)


def add_deployment(
    cluster: Cluster,
    name: str,
    model: str,
    num_encoders: int = 1,
    encoder_flags: Sequence[str] = (),
    decoder_flags: Sequence[str] = (),
    common_flags: Sequence[str] = (),
    tls: Mapping[str, TlsFiles] | None = None,
) -> ServiceArm:
    """Starts (without waiting for) one deployment's processes in `cluster`; with `tls`
    (files per role, tessera.certs), every hop uses mutual TLS. The processes split the
    host's CPUs as `tessera serve` does (`shared_host_threads`)."""
    base = ["--model", model, *common_flags]

    def security(role: str) -> list[str]:
        return tls_args(tls[role]) if tls else []

    encoders = [f"{name}-encoder{i}" for i in range(num_encoders)]
    encoder_flags = [*shared_host_threads("encoder", encoder_flags, num_encoders), *encoder_flags]
    addresses = [
        cluster.start(e, "encoder", [*base, *security("encoder"), *encoder_flags]) for e in encoders
    ]
    encoder_list = ["--encoders", ",".join(addresses)]
    decoder_flags = [*shared_host_threads("decoder", decoder_flags), *decoder_flags]
    decoder = cluster.start(
        f"{name}-decoder", "decoder", [*base, *security("decoder"), *encoder_list, *decoder_flags]
    )
    routes = ["--encoders", ",".join(addresses), "--decoders", decoder]
    gateway_flags = [*shared_host_threads("gateway", ()), *routes]
    cluster.start(f"{name}-gateway", "gateway", [*base, *security("gateway"), *gateway_flags])
    client = tls["client"] if tls else None
    return ServiceArm(name, cluster, encoders, f"{name}-decoder", f"{name}-gateway", client)
