"""The cores and memory this process may really use: cgroup limits, not the host's totals.

In a container (Kubernetes sets ``resources.limits`` as cgroup limits) ``os.cpu_count()`` and
``psutil.virtual_memory()`` report the *node*: a pod limited to 2 CPUs on a 64-core node would
plan 32 workers that share 2 cores' worth of CFS quota, and a pod limited to 4 GiB would size its
batches by the node's free memory until the kernel's OOM killer ends it. The worker plan, the
memory budget and the KV-cache budget read these two functions instead.

cgroup v2 (``cpu.max``, ``memory.max``) and v1 (``cpu.cfs_quota_us``, ``memory.limit_in_bytes``)
are read under ``root``; inside a container the cgroup namespace makes its own group the root.
No limit file, or a limit of ``max``: the host's figures. CPU affinity (``taskset``, a cpuset)
limits the cores too.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded LONG_MAX


@dataclass(frozen=True)
class Limits:
    cores: int  # whole cores: the CFS quota rounded up, within the affinity mask
    memory_limit_bytes: int | None  # the cgroup's memory limit, None if unlimited
    memory_available_bytes: int  # what may still be allocated before the limit (or the host) runs out
    source: str  # "cgroup v2", "cgroup v1" or "host": said in the worker plan's log line

    def describe(self) -> str:
        memory = f"{self.memory_limit_bytes / 2**30:.1f} GiB limit" if self.memory_limit_bytes else "no memory limit"
        return f"{self.cores} core(s), {memory} ({self.source})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _cpu_quota(root: Path) -> tuple[float | None, str | None]:
    """CPUs granted by the CFS quota, and which cgroup version said so."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return (None if quota == "max" else int(quota) / int(period or 100000)), "cgroup v2"
    quota_v1, period_v1 = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if quota_v1 is not None and period_v1:
        return (None if int(quota_v1) <= 0 else int(quota_v1) / int(period_v1)), "cgroup v1"
    return None, None


def _memory(root: Path) -> tuple[int | None, int | None, str | None]:
    """(limit, usage) in bytes, and which cgroup version said so. Usage leaves out the inactive
    page cache, which the kernel reclaims before it kills anything."""
    v2 = _read(root / "memory.max")
    if v2 is not None:
        limit = None if v2 == "max" else int(v2)
        return limit, _usage(_read(root / "memory.current"), _stat(root / "memory.stat", "inactive_file")), "cgroup v2"
    v1 = _read(root / "memory" / "memory.limit_in_bytes")
    if v1 is not None:
        limit = None if int(v1) >= _V1_UNLIMITED else int(v1)
        usage = _usage(
            _read(root / "memory" / "memory.usage_in_bytes"),
            _stat(root / "memory" / "memory.stat", "total_inactive_file"),
        )
        return limit, usage, "cgroup v1"
    return None, None, None


def _stat(path: Path, key: str) -> int:
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _usage(current: str | None, reclaimable: int) -> int | None:
    return None if current is None else max(0, int(current) - reclaimable)


def limits(root: Path = CGROUP_ROOT) -> Limits:
    """This process's cores and memory, under whichever of cgroup and host is tighter."""
    cores = _affinity_cores()
    quota, cpu_source = _cpu_quota(root)
    if quota is not None:
        cores = max(1, min(cores, math.ceil(quota - 1e-9)))
    host_available = psutil.virtual_memory().available
    limit, usage, memory_source = _memory(root)
    available = host_available
    if limit is not None:
        available = min(host_available, max(0, limit - (usage or 0)))
    limited = (quota is not None and cpu_source) or (limit is not None and memory_source)
    return Limits(cores=cores, memory_limit_bytes=limit, memory_available_bytes=available, source=limited or "host")
