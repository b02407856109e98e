"""The fleet the chaos and soak harnesses run on: the test hosts where they can be made,
else loopback (whose rows that need a network are skipped, with the reason)."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

from tessera.testbed.fleet import Fleet, FleetPlan, LoopbackFleet
from tessera.testbed.hosts import unavailable_reason

# Pins of a request whose release is lost end with their lease: short here, so that the
# leak check after the load needs to wait only this long.
LEASE_MS = 20_000


def demo_model() -> str:
    from tessera.demo_models import make_demo_model

    directory = Path(tempfile.mkdtemp(prefix="tessera-chaos-model-"))
    return str(make_demo_model(directory / "tiny", seed=0, size="tiny"))


def start_fleet(model: str, loopback: bool) -> tuple[Fleet, str]:
    """The started fleet and a line describing its network."""
    plan = FleetPlan(model, extra_flags={"gateway": ["--lease-ms", str(LEASE_MS)]})
    reason = "asked for loopback" if loopback else unavailable_reason()
    if reason is None:
        from tessera.testbed.netfleet import NetFleet

        fleet: Fleet = NetFleet(plan)
        network = "test hosts: a network namespace per process, a userspace switch, dnsmasq"
    else:
        fleet = LoopbackFleet(plan)
        network = f"loopback ({reason})"
    try:
        fleet.start_all()
    except BaseException:
        fleet.stop()
        raise
    return fleet, network


def heal_everything(fleet: Fleet) -> None:
    """Back to a whole fleet between rows: every process running and serving."""
    for proc in fleet.procs.values():
        proc.signal(signal.SIGCONT)  # nothing stays stopped
    fleet.restart_all([name for name, proc in fleet.procs.items() if not proc.running()])
