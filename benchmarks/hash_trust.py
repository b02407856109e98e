"""What checking a content hash costs the encoder: `Encode` of fresh images from a
caller it trusts with hashes (a gateway certificate) and from one it checks (a decoder
certificate), alternated call by call on one encoder with mutual TLS.

    python -m benchmarks.hash_trust [--model DIR] [--sides 512 1536] [--repeats 16]

Each call's wall time is taken at the client; the encoder's CPU time per call is read
from /proc (every thread of the process, nanoseconds), which other load on the machine
inflates far less than wall time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_model, markdown_table
from tessera.certs import write_role_certificates
from tessera.media import decode_image
from tessera.testbed.cluster import Cluster
from tessera.testbed.media import noise_image
from tessera.tls import sync_channel, tls_args
from tessera.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc

RULES = {"trusted": "gateway", "verified": "decoder"}  # which certificate calls


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far (schedstat: ns on the CPU)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
    return total / 1e9


def encode_once(
    stub: encoder_pb2_grpc.EncoderServiceStub, image: bytes, fingerprint: str, pid: int
) -> tuple[float, float]:
    """(wall seconds, encoder CPU seconds) of one Encode of `image`."""
    item = common_pb2.MediaItem(
        modality=common_pb2.MODALITY_IMAGE,
        data=image,
        content_hash=decode_image(image).content_hash(fingerprint),
    )
    request = encoder_pb2.EncodeRequest(items=[item], model_fingerprint=fingerprint)
    cpu = cpu_seconds(pid)
    started = time.perf_counter()
    response = stub.Encode(request, timeout=120)
    wall = time.perf_counter() - started
    assert response.items[0].source == encoder_pb2.ENCODE_SOURCE_COMPUTED
    return wall, cpu_seconds(pid) - cpu


def measure(
    model: str, sides: list[int], repeats: int
) -> dict[tuple[int, str], list[tuple[float, float]]]:
    roles = write_role_certificates(Path(tempfile.mkdtemp(prefix="tessera-bench-tls-")))
    cluster = Cluster(client_tls=roles["client"])
    cluster.start("encoder", "encoder", ["--model", model, *tls_args(roles["encoder"])])
    try:
        cluster.wait_ready()
        fingerprint = cluster.fingerprint("encoder")
        pid = cluster.child("encoder").process.pid
        stubs = {
            rule: encoder_pb2_grpc.EncoderServiceStub(
                sync_channel(cluster.address("encoder"), roles[role])
            )
            for rule, role in RULES.items()
        }
        samples: dict[tuple[int, str], list[tuple[float, float]]] = {}
        seed = 70_000
        for index in range(repeats + 1):  # the first round warms the encoder up
            for side in sides:
                order = list(RULES) if index % 2 else list(reversed(RULES))
                for rule in order:
                    seed += 1
                    image = noise_image(seed, side, side)
                    sample = encode_once(stubs[rule], image, fingerprint, pid)
                    if index:
                        samples.setdefault((side, rule), []).append(sample)
        return samples
    finally:
        cluster.stop()


def table(samples: dict[tuple[int, str], list[tuple[float, float]]]) -> str:
    rows = []
    for (side, rule), values in sorted(samples.items()):
        walls, cpus = zip(*values, strict=True)
        rows.append(
            [side, rule, len(values), statistics.median(walls) * 1000, statistics.mean(cpus) * 1000]
        )
    headers = ["image side (px)", "hash", "calls", "Encode wall ms (median)", "encoder CPU ms/call"]
    return markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint (default: a fresh bench demo model)")
    parser.add_argument("--sides", type=int, nargs="+", default=[512, 1536])
    parser.add_argument("--repeats", type=int, default=16, help="calls per side and rule")
    args = parser.parse_args()
    model = bench_model(args.model, "llava")
    print(table(measure(model, args.sides, args.repeats)))


if __name__ == "__main__":
    main()
