"""Session-wide fixtures: one demo checkpoint, one set of services, one reference model.

Importing torch and loading a model costs seconds per process on small machines, so
services start once per test session and every service test shares them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster
from tessera.testbed.devices import DTYPES, RunOn
from tessera.testbed.zygote import Zygote


def pytest_configure(config) -> None:
    """Decoders the tests start run torch's linears unless a test names a kernel (the
    session's decoder: oneDNN). `auto`, the default, times both kernels at load after
    waiting for a quiet host, seconds of every stack's start, and chooses by host;
    tests/unit/test_linear_choice.py tests it. Child processes inherit the variable."""
    os.environ.setdefault("TESSERA_LINEAR_KERNEL", "torch")


def pytest_addoption(parser) -> None:
    """Where the services and the oracle run (scripts/gpu_check.sh: cuda, bfloat16)."""
    parser.addoption("--tessera-device", default="cpu", help="torch device of services and oracle")
    parser.addoption(
        "--tessera-dtype",
        default="float32",
        choices=list(DTYPES),
        help="dtype of services and oracle; greedy output is compared with generate() run "
        "in the same dtype on the same device",
    )


@pytest.fixture(scope="session", autouse=True)
def zygote() -> Iterator[Zygote]:
    """The services tests start fork from one process that imported their modules once
    (tessera.testbed.zygote): a service is ready in about a second instead of eight
    on a 2-core host. `tessera serve` and the fleets on test hosts still start cold."""
    forks = Zygote()
    Cluster.zygote = forks
    try:
        yield forks
    finally:
        Cluster.zygote = None
        forks.close()


@pytest.fixture(scope="session")
def run_on(pytestconfig) -> RunOn:
    return RunOn(pytestconfig.getoption("tessera_device"), pytestconfig.getoption("tessera_dtype"))


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory) -> Path:
    from tessera.demo_models import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("demo") / "tiny", seed=0, size="tiny")


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory) -> Path:
    """Same architecture and config, other weights."""
    from tessera.demo_models import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("demo") / "tiny-seed1", seed=1, size="tiny")


@pytest.fixture(scope="session")
def cluster(demo_model_dir, run_on) -> Cluster:
    """Gateway + encoder + decoder, plus a second encoder with no cache to speak of."""
    # Reflection is off by default; test_lifecycle checks it is served when asked for.
    model = ["--model", str(demo_model_dir), "--enable-reflection", *run_on.service_args()]
    services = Cluster()
    try:
        services.metrics_ports = {"encoder": free_port(), "decoder": free_port()}
        encoder = services.start(
            "encoder", "encoder", [*model, "--metrics-port", str(services.metrics_ports["encoder"])]
        )
        # A cache that keeps nothing unpinned; a request's pins keep its items while
        # its prefill needs them (pins have a budget of their own past the cache's).
        pins = ["--max-pinned-bytes", str(64 << 20), "--max-pinned-bytes-per-owner", str(64 << 20)]
        # One torch thread: test_lifecycle checks the ready line names it.
        small = services.start(
            "small-encoder",
            "encoder",
            [*model, "--cache-bytes", "0", *pins, "--torch-threads", "1"],
        )
        # The decoder dials only the encoders it is given: both, so that tests may send it
        # requests naming either. Its linears on oneDNN whatever this host's timings
        # would choose (--linear-kernel auto): every exactness test then runs the kernel
        # that differs from generate()'s; other stacks run the default.
        decoder = services.start(
            "decoder",
            "decoder",
            [
                *model,
                "--linear-kernel",
                "onednn",
                "--encoders",
                f"{encoder},{small}",
                "--metrics-port",
                str(services.metrics_ports["decoder"]),
            ],
        )
        services.start("gateway", "gateway", [*model, "--encoders", encoder, "--decoders", decoder])
        services.wait_ready()
        yield services
    finally:
        services.stop()


@pytest.fixture(scope="session")
def reference(demo_model_dir, run_on):
    """The oracle: the checkpoint's own model and processor, in this process, on the
    services' device and dtype."""
    from tessera.testbed.reference import Reference

    return Reference(demo_model_dir, run_on)


def pytest_terminal_summary(terminalreporter) -> None:
    """Reports every greedy difference accepted as a near-tie (docs/design.md: the reference's
    top two logits within 1e-5 at the first differing step)."""
    from tessera.testbed.reference import NEAR_TIES

    terminalreporter.write_sep("-", f"near-ties accepted: {len(NEAR_TIES)}")
    for line in NEAR_TIES:
        terminalreporter.write_line(line)
