"""The CPUs a service may use (affinity and cgroup quota) and how services on one host
split them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera import cpus
from tessera.cpus import _cgroup_paths, _quota_v1, _quota_v2, _tightest_quota, usable_cpus


def test_cgroup_paths_of_v2_and_v1():
    assert _cgroup_paths("0::/kubepods/pod1/c1\n") == ("/kubepods/pod1/c1", None)
    v1 = "5:memory:/x\n4:cpu,cpuacct:/kubepods/pod2\n0::/\n"
    assert _cgroup_paths(v1) == ("/", "/kubepods/pod2")


def write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def test_v2_quota_is_the_tightest_on_the_way_to_the_root(tmp_path):
    write(tmp_path, {"cpu.max": "max 100000\n"})
    pod = write(tmp_path / "kubepods" / "pod", {"cpu.max": "250000 100000\n"})
    container = write(pod / "c1", {"cpu.max": "max 100000\n"})
    assert _quota_v2(tmp_path) is None
    assert _quota_v2(pod) == 2.5
    assert _tightest_quota(container, tmp_path, _quota_v2) == 2.5
    assert _tightest_quota(tmp_path, tmp_path, _quota_v2) is None


def test_v1_quota(tmp_path):
    limited = write(tmp_path / "a", {"cpu.cfs_quota_us": "150000", "cpu.cfs_period_us": "100000"})
    unlimited = write(tmp_path / "b", {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    assert _quota_v1(limited) == 1.5
    assert _quota_v1(unlimited) is None
    assert _quota_v1(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("quota", "affinity", "expected"),
    [(None, 8, 8), (2.5, 8, 3), (0.5, 8, 1), (16.0, 4, 4), (1.0, 1, 1)],
)
def test_usable_cpus_is_the_affinity_capped_by_the_quota_rounded_up(quota, affinity, expected):
    assert usable_cpus(quota=quota, affinity=affinity) == expected


def test_usable_cpus_of_this_process_is_within_its_affinity():
    import os

    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("service", "num_cpus", "num_replicas", "expected"),
    [
        ("decoder", 2, 1, 2),
        ("encoder", 2, 1, 1),
        ("gateway", 2, 1, 1),
        ("encoder", 16, 1, 8),
        ("encoder", 16, 4, 2),
        ("decoder", 16, 2, 8),
        ("encoder", 1, 1, 1),
    ],
)
def test_shared_host_split(service, num_cpus, num_replicas, expected):
    assert cpus.shared_host_torch_threads(service, num_cpus, num_replicas) == expected


def test_set_torch_threads_zero_uses_the_usable_cpus(monkeypatch):
    """0 takes the process's usable CPUs where torch's own default is more (a container
    with a quota below the host's cores)."""
    import torch

    from tessera.compute_thread import set_torch_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 1.0)
    try:
        set_torch_threads(0)
        assert torch.get_num_threads() == 1
        set_torch_threads(3)
        assert torch.get_num_threads() == 3
        with pytest.raises(ValueError, match=">= 0"):
            set_torch_threads(-1)
    finally:
        torch.set_num_threads(before)
