"""How many CPUs this process may use, and how services sharing a host split them.

torch sizes its intra-op thread pool from the host's cores, not from what the process is
allowed: a pod limited to 4 CPUs on a 64-core node runs 64 OpenMP threads that spin
against each other in 4 CPUs' worth of time slices. `usable_cpus` reads the two limits a
container or `taskset` sets: the affinity mask and the cgroup CPU quota (v2 `cpu.max`,
v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounding the quota up.

    affinity 8 CPUs, cpu.max "250000 100000"  -> min(8, ceil(2.5)) = 3
    affinity 2 CPUs, no quota ("max 100000")   -> 2
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_paths(proc_cgroup: str) -> tuple[str | None, str | None]:
    """This process's cgroup v2 path and v1 `cpu` controller path, from /proc/self/cgroup
    ("0::/kubepods/pod1" for v2, "4:cpu,cpuacct:/kubepods/pod1" for v1)."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        hierarchy, controllers, path = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and not controllers:
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period


def _tightest_quota(leaf: Path, root: Path, read) -> float | None:
    """The smallest quota on the way from `leaf` up to `root` (a parent's limit binds its
    children; inside a container the leaf is usually the root itself)."""
    quotas = []
    directory = leaf
    while True:
        quota = read(directory)
        if quota is not None:
            quotas.append(quota)
        if directory == root or root not in directory.parents:
            break
        directory = directory.parent
    return min(quotas) if quotas else None


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """CPUs' worth of time the cgroup allows per period, or None when unlimited."""
    try:
        v2, v1 = _cgroup_paths(Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    if v2 is not None and (cgroup_root / "cgroup.controllers").exists():
        leaf = cgroup_root / v2.lstrip("/")
        return _tightest_quota(leaf, cgroup_root, _quota_v2)
    if v1 is not None:
        root = cgroup_root / "cpu"
        leaf = root / v1.lstrip("/")
        if not leaf.exists():  # a container sees its own cgroup at the mount's root
            leaf = root
        return _tightest_quota(leaf, root, _quota_v1)
    return None


def usable_cpus(quota: float | None = None, affinity: int | None = None) -> int:
    """CPUs this process may use: the affinity mask, capped by the cgroup quota."""
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        affinity = affinity or os.cpu_count() or 1
    if quota is None:
        quota = cgroup_cpu_quota()
    return max(1, min(affinity, math.ceil(quota)) if quota else affinity)


def shared_host_torch_threads(service: str, cpus: int, num_replicas: int = 1) -> int:
    """--torch-threads for each of `num_replicas` of `service` when the encoders, decoders
    and gateway share one host's `cpus` (`tessera serve`, the benchmarks' deployments).

    Each service's OpenMP threads default to every CPU, and two processes' parallel
    regions then wait at barriers for threads the other has preempted. The decoder keeps
    every CPU: its decode steps are many small ops that one thread runs slower. The
    encoder and the gateway's media processing get half (at least one). Measured on 2
    cores (docs/benchmarks.md): encoder at 1 thread, 4 clients, new images in every
    request 1.17-1.24x `generate()`'s throughput against 0.71-0.94x with 2; the same
    with 80% of images cached; at 16 clients 1.62x against 1.33x.
    """
    share = cpus if service == "decoder" else cpus // 2
    return max(1, share // num_replicas)


def shared_host_expedite_threads(cpus: int, num_encoders: int = 1) -> int:
    """--expedite-torch-threads for each of `num_encoders` encoders sharing a host's
    `cpus`: while a decoder idles for their items the host is theirs, split evenly
    (encoder_service.expedite).

    Example: 2 CPUs, 1 encoder -> 2; 8 CPUs, 3 encoders -> 2."""
    return max(1, cpus // num_encoders)
