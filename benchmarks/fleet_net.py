"""How long the decoder waits on embedding rows when the encoders are across a network:
the same image requests on the test hosts with the decoder-encoder links at no added
delay, at 0.5 ms round trip and 10 Gbit/s, and at 5 ms round trip, arms interleaved.

    python -m benchmarks.fleet_net [--model M] [--requests 12] [--out DIR]

Every image is encoded once before the arms run (a warm-up pass) and prefix caching is
off, so each request's fetch wait is what moving its rows costs: the chunks ahead are
prefetched while earlier chunks run, so a wait near zero means the round trip is hidden.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import bench_model, environment, markdown_table
from tessera.client import Client, Message, SamplingParams
from tessera.testbed.control import LinkShape
from tessera.testbed.fleet import FleetPlan
from tessera.testbed.hosts import unavailable_reason
from tessera.testbed.media import noise_image

ARMS = {
    "no added delay": LinkShape(),
    "0.5 ms RTT, 10 Gbit/s": LinkShape(delay_ms=0.25, rate_mbit=10_000),
    "5 ms RTT": LinkShape(delay_ms=2.5),
}
MAX_CHUNK_TOKENS = 64
MAX_NEW_TOKENS = 4


def request(client: Client, index: int) -> dict[str, float]:
    image = noise_image(9100 + index, 224, 224)
    done = client.complete(
        [Message("user", [image, "Describe the picture."])],
        SamplingParams(max_tokens=MAX_NEW_TOKENS),
        max_chunk_tokens=MAX_CHUNK_TOKENS,
        cache_salt="fleet-net",
    )
    decoder = done.stats.decoder
    return {
        "fetch_wait_ms": decoder.fetch_wait_ms,
        "ttft_ms": decoder.time_to_first_token_ms,
        "num_embedding_bytes": decoder.num_embedding_bytes,
        "num_chunks": len(decoder.chunks),
    }


def set_links(fleet, link: LinkShape) -> None:
    for decoder in fleet.names("decoder"):
        for encoder in fleet.names("encoder"):
            fleet.shape(decoder, encoder, link)


def summary(samples: list[dict[str, float]], key: str) -> tuple[float, float]:
    values = sorted(sample[key] for sample in samples)
    return statistics.median(values), values[min(len(values) - 1, int(0.9 * len(values)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_net", description=__doc__)
    parser.add_argument("--model", default="", help="checkpoint; the bench demo model if empty")
    parser.add_argument("--requests", type=int, default=12, help="requests per arm")
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="results dir")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"fleet_net: test hosts cannot be made here: {reason}")
    from tessera.testbed.netfleet import NetFleet

    model = bench_model(args.model or None, "llava")
    env = environment(model, sys.argv[1:] if argv is None else argv)
    plan = FleetPlan(model, num_decoders=1, extra_flags={"decoder": ["--no-enable-prefix-caching"]})
    fleet = NetFleet(plan)
    samples: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    try:
        print("fleet_net: starting the fleet on test hosts...", flush=True)
        fleet.start_all()
        with Client(fleet.gateway_address, timeout_seconds=300) as client:
            for index in range(args.requests):  # warm-up: every image encoded once
                request(client, index)
            for index in range(args.requests):
                for arm, link in ARMS.items():  # interleaved: A B C A B C ...
                    set_links(fleet, link)
                    samples[arm].append(request(client, index))
                print(f"fleet_net: {index + 1}/{args.requests}", flush=True)
    finally:
        fleet.stop()
    rows = []
    for arm, arm_samples in samples.items():
        wait_p50, wait_p90 = summary(arm_samples, "fetch_wait_ms")
        ttft_p50, ttft_p90 = summary(arm_samples, "ttft_ms")
        rows.append([arm, len(arm_samples), wait_p50, wait_p90, ttft_p50, ttft_p90])
    table = markdown_table(
        ["decoder-encoder link", "requests", "fetch wait p50 ms", "p90", "TTFT p50 ms", "p90"],
        rows,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet_net.json").write_text(
        json.dumps({"environment": env, "samples": samples}, indent=1)
    )
    (args.out / "fleet_net.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
