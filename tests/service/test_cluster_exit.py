"""A harness that dies does not leave its services running: a cluster started cold
stops them when the harness's process exits, by an exception or by SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

HARNESS = """
import sys
from tessera.testbed.cluster import Cluster

cluster = Cluster(cold=True)
cluster.start("encoder", "encoder", ["--model", sys.argv[1]])
print(cluster.child("encoder").process.pid, flush=True)
raise RuntimeError("the harness failed")
"""


WAITING_HARNESS = """
import sys, time
from tessera.testbed.cluster import Cluster

cluster = Cluster(cold=True)
cluster.start("encoder", "encoder", ["--model", sys.argv[1]])
print(cluster.child("encoder").process.pid, flush=True)
time.sleep(600)  # until SIGTERM
"""


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_harness_that_raises_stops_the_services_it_started(demo_model_dir):
    done = subprocess.run(
        [sys.executable, "-c", HARNESS, str(demo_model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "RuntimeError: the harness failed" in done.stderr
    pid = int(done.stdout.split()[0])
    try:
        # The harness waited for its service to exit and reaped it before it ended.
        assert not running(pid)
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_harness_told_to_stop_stops_the_services_it_started(demo_model_dir):
    """`timeout` and CI runners send SIGTERM, whose default would end the harness with
    its exit hooks unrun."""
    harness = subprocess.Popen(
        [sys.executable, "-c", WAITING_HARNESS, str(demo_model_dir)],
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = 0
    try:
        pid = int(harness.stdout.readline())
        harness.send_signal(signal.SIGTERM)
        assert harness.wait(timeout=120) != 0
        assert not running(pid)
    finally:
        harness.kill()
        if pid and running(pid):
            os.kill(pid, signal.SIGKILL)
