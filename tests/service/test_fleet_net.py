"""The fleet across a network: every role on a host of its own (network namespaces on a
userspace switch), replicas found through a real DNS server as on Kubernetes, links
shaped and cut; then replicas killed under open-loop load (the full fault schedule is
`make chaos`). One fleet for the module."""

from __future__ import annotations

import sys

import grpc
import pytest

from benchmarks.chaos.faults import schedule
from benchmarks.chaos.fleets import LEASE_MS, heal_everything
from benchmarks.chaos.load import healthy_answers
from benchmarks.chaos.rows import run_row
from tessera.client import Client, Message, SamplingParams
from tessera.testbed import leaks
from tessera.testbed.control import LinkShape
from tessera.testbed.fleet import FleetPlan
from tessera.testbed.hosts import unavailable_reason
from tessera.testbed.reference import assert_greedy_match, noise_image
from tessera.v1 import decoder_pb2, decoder_pb2_grpc

MAX_NEW_TOKENS = 6
RATE_PER_SECOND = 4.0
ENCODER_PORT = 50052
CONNECT_PROBE = (
    "import socket, sys, time\n"
    "started = time.monotonic()\n"
    "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))\n"
    "print(time.monotonic() - started)\n"
)


@pytest.fixture(scope="module")
def net(demo_model_dir):
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"test hosts cannot be made here: {reason}")
    from tessera.testbed.netfleet import NetFleet

    plan = FleetPlan(str(demo_model_dir), extra_flags={"gateway": ["--lease-ms", str(LEASE_MS)]})
    fleet = NetFleet(plan)
    try:
        fleet.start_all()
        yield fleet
    finally:
        fleet.stop()


def connect_seconds(net, source: str, target: str, timeout: float = 2.0) -> float | None:
    """Seconds a TCP connect from `source`'s host to `target`'s gRPC port took (one round
    trip), or None if it failed."""
    host, port = net.address(target).rsplit(":", 1)
    done = net.run_in(source, sys.executable, "-c", CONNECT_PROBE, host, port, str(timeout))
    return float(done.stdout) if done.returncode == 0 else None


def encoder_ips(net) -> list[str]:
    return sorted(net.host_ip(name) for name in net.names("encoder"))


def test_every_host_finds_every_encoder_through_dns(net):
    assert len(set(encoder_ips(net))) == 3
    for host in ("gateway", "decoder-0", "decoder-1"):
        assert net.resolve(host, "encoders") == encoder_ips(net), host
    assert net.resolve("encoder-1", "redis") == [net.host_ip("redis")]


def test_answers_across_hosts_equal_generate(net, reference):
    prompts = [
        [("user", ["Tell me about the lake at night."])],
        [("user", [noise_image(1501, 40, 36), "What is this?"])],
        [("user", [noise_image(1502, 30, 44), "and", noise_image(1501, 40, 36), "compare"])],
    ]
    with Client(net.gateway_address, timeout_seconds=120) as client:
        for prompt in prompts:
            done = client.complete(
                [Message(role, parts) for role, parts in prompt],
                SamplingParams(max_tokens=MAX_NEW_TOKENS),
                max_chunk_tokens=8,
            )
            assert_greedy_match(done.token_ids, reference.generate(prompt, MAX_NEW_TOKENS))
    # The image rows crossed the network: from an encoder's host to a decoder's.
    assert done.stats.num_embedding_bytes > 0


def test_dns_answers_change_while_serving(net):
    everyone = encoder_ips(net)
    try:
        net.set_dns("encoders", everyone[:2])
        for host in ("gateway", "decoder-0"):
            assert net.resolve(host, "encoders") == everyone[:2]
    finally:
        net.set_dns("encoders", everyone)
    assert net.resolve("decoder-1", "encoders") == everyone


def test_a_shaped_link_delays_that_pair_only(net):
    net.shape("decoder-0", "encoder-0", LinkShape(delay_ms=60, jitter_ms=5))
    try:
        # A connect is one round trip: at least the delay each way, whatever the load.
        assert connect_seconds(net, "decoder-0", "encoder-0") >= 2 * (60 - 5) / 1000
        assert connect_seconds(net, "encoder-0", "decoder-0") >= 2 * (60 - 5) / 1000
    finally:
        net.unshape("decoder-0", "encoder-0")
    assert not net.links.shapes


def test_a_partition_cuts_one_pair_and_heals(net):
    net.partition("decoder-1", "encoder-2")
    try:
        assert connect_seconds(net, "decoder-1", "encoder-2", timeout=1.0) is None
        assert connect_seconds(net, "encoder-2", "decoder-1", timeout=1.0) is None
        assert connect_seconds(net, "decoder-1", "encoder-1") is not None
        assert connect_seconds(net, "gateway", "encoder-2") is not None
    finally:
        net.heal("decoder-1", "encoder-2")
    assert connect_seconds(net, "decoder-1", "encoder-2") is not None


def decoder_stats(net, name: str) -> decoder_pb2.DecoderStats:
    with grpc.insecure_channel(net.address(name)) as channel:
        return decoder_pb2_grpc.DecoderServiceStub(channel).GetStats(
            decoder_pb2.GetDecoderStatsRequest(), timeout=10
        )


def test_a_decoder_killed_mid_answer_is_resumed_exactly(net):
    """The gateway resumes an answer on the other decoder after the tokens the client
    already has; greedy, it is the answer an uninterrupted run gives."""
    messages = [Message("user", ["Tell me a long story about the sea."])]
    sampling = SamplingParams(max_tokens=300, ignore_eos=True)
    with Client(net.gateway_address, timeout_seconds=300, max_retries=0) as client:
        whole = client.complete(messages, sampling, cache_salt="resume-whole")
        assert len(whole.token_ids) == 300
        deltas = client.deltas(messages, sampling, cache_salt="resume-cut")
        received = list(next(d for d in deltas if d.token_ids).token_ids)
        (serving,) = [n for n in net.names("decoder") if decoder_stats(net, n).num_running]
        (other,) = [n for n in net.names("decoder") if n != serving]
        finished_before = decoder_stats(net, other).num_finished
        net.kill(serving)
        rest = list(deltas)
    try:
        received += [token for delta in rest for token in delta.token_ids]
        assert received == whole.token_ids
        assert rest[-1].usage.completion_tokens == 300
        assert rest[-1].usage.prompt_tokens == len(whole.prompt_token_ids)
        assert decoder_stats(net, other).num_finished == finished_before + 1, "resumed there"
    finally:
        heal_everything(net)


def test_with_every_decoder_gone_the_client_is_told_so_without_internal_addresses(net):
    for name in net.names("decoder"):
        net.kill(name)
    try:
        with (
            Client(net.gateway_address, timeout_seconds=60, max_retries=0) as client,
            pytest.raises(grpc.RpcError) as caught,
        ):
            client.complete([Message("user", ["Anyone there?"])], SamplingParams(max_tokens=4))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "no decoder" in caught.value.details()
        assert net.host_ip("decoder-0").rsplit(".", 1)[0] not in caught.value.details()
    finally:
        heal_everything(net)


@pytest.fixture(scope="module")
def healthy(net) -> dict[int, list[int]]:
    return healthy_answers(net.gateway_address)


def test_a_decoder_killed_under_load_fails_no_request(net, healthy):
    """Open-loop load while a decoder is SIGKILLed and restarted: every request is
    answered, every answer is the healthy run's, and the client never had to retry (the
    gateway retries or resumes on the other decoder). Encoders killed under load:
    test_fleet.py and test_serve_fleet.py; every fault: `make chaos`."""
    fault = next(fault for fault in schedule() if fault.name == "decoder-kill-9")
    row = run_row(net, fault, healthy, RATE_PER_SECOND)
    heal_everything(net)
    assert row.num_sent > 0
    assert row.num_wrong == 0, row
    assert row.num_failed == 0, row
    assert row.num_retried == 0, "the gateway, not the client, routes around the failure"
    assert row.num_exact == row.num_sent
    assert row.recovery_seconds is not None, "answers again after the restart"


def test_nothing_is_held_after_the_load(net, healthy):
    """After the rows above: no KV blocks, pins or compute leases left anywhere (pins of
    a request whose release was lost end with their lease)."""
    assert leaks.wait_quiet(net, max_seconds=LEASE_MS / 1000 + 30) == []
