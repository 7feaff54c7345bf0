"""Where a number was measured: the hardware profile and dependency versions recorded in manifests."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import psutil

TRACKED_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "aieng")


def dependency_versions() -> dict[str, str]:
    out = {}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_profile() -> dict:
    """A snapshot of this host. Does not initialise CUDA (safe before a fork)."""
    import torch

    profile = {
        "device": "cpu",
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():  # reports without creating a CUDA context
        profile["device"] = "cuda"
        profile["gpu_count"] = torch.cuda.device_count()
    return profile


def matmul_gflops(threads: int, *, size: int = 512, repeats: int = 5) -> float:
    """Median GFLOP/s of a float32 ``size``×``size`` matmul with ``threads`` torch threads.

    The workbook uses it to show why workers × threads must not exceed the cores: past the
    core count, throughput per process stops growing (or drops) while latency spreads.
    """
    import statistics
    import time

    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)  # first call pays for lazy initialisation
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        return 2 * size**3 / statistics.median(times) / 1e9
    finally:
        torch.set_num_threads(previous)
