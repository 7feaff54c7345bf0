"""A container's CPU quota and memory limit, read from a fake cgroup tree, bound the plan."""

import os

import psutil
import pytest

from aieng.host import container_limits
from aieng.server.process.worker_plan import plan_workers

GiB = 2**30


def write(root, **files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def many_host_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))


def test_cgroup_v2_quota_and_memory_limit(tmp_path, many_host_cores):
    root = write(
        tmp_path,
        **{
            "cpu.max": "250000 100000\n",
            "memory.max": str(4 * GiB),
            "memory.current": str(3 * GiB),
            "memory.stat": f"anon 1\ninactive_file {GiB // 2}\n",
        },
    )
    limits = container_limits.limits(root)
    assert limits.cores == 3  # 2.5 CPUs of quota: a third thread still gets half a core
    assert limits.memory_limit_bytes == 4 * GiB
    assert limits.memory_available_bytes == min(psutil.virtual_memory().available, 4 * GiB - (3 * GiB - GiB // 2))
    assert limits.source == "cgroup v2" and "3 core(s), 4.0 GiB limit" in limits.describe()


def test_cgroup_v2_without_limits_is_the_host(tmp_path, many_host_cores):
    root = write(tmp_path, **{"cpu.max": "max 100000\n", "memory.max": "max\n", "memory.current": "123"})
    limits = container_limits.limits(root)
    assert (limits.cores, limits.memory_limit_bytes, limits.source) == (64, None, "host")


def test_cgroup_v1_quota_and_unlimited_memory(tmp_path, many_host_cores):
    root = write(
        tmp_path,
        **{
            "cpu/cpu.cfs_quota_us": "200000",
            "cpu/cpu.cfs_period_us": "100000",
            "memory/memory.limit_in_bytes": "9223372036854771712",
            "memory/memory.usage_in_bytes": "1",
        },
    )
    limits = container_limits.limits(root)
    assert (limits.cores, limits.memory_limit_bytes, limits.source) == (2, None, "cgroup v1")


def test_affinity_is_tighter_than_a_generous_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    root = write(tmp_path, **{"cpu.max": "800000 100000"})
    assert container_limits.limits(root).cores == 2


def test_no_cgroup_files_at_all(tmp_path, many_host_cores):
    limits = container_limits.limits(tmp_path)
    assert limits.cores == 64 and limits.source == "host"
    assert limits.memory_available_bytes == pytest.approx(psutil.virtual_memory().available, rel=0.05)


def test_a_two_cpu_pod_on_a_64_core_node_plans_for_two_cores(tmp_path, many_host_cores):
    root = write(tmp_path, **{"cpu.max": "200000 100000", "memory.max": str(8 * GiB), "memory.current": "0"})
    limits = container_limits.limits(root)
    plan = plan_workers(
        cores=limits.cores, available_bytes=limits.memory_available_bytes, weight_bytes=2**20, per_worker_bytes=2**20
    )
    assert plan.workers * plan.torch_threads <= 2
