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
