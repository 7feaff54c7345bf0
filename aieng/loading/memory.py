"""Refuse a load that cannot fit, before reading a single weight, with the numbers in the message.

The estimate is weights only (parameters × bytes per element of the target dtype) plus a fixed
overhead factor for the runtime; the KV cache is budgeted later by the engine. Loading first and
discovering the OOM half-way (or being OOM-killed) is the failure this prevents.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aieng.errors import ModelLoadError
from aieng.host import container_limits

GiB = 1024**3
WEIGHT_OVERHEAD = 1.2  # transient copies while materialising weights, allocator slack


@dataclass(frozen=True)
class MemoryBudget:
    device: str
    needed_bytes: int
    allowed_bytes: int
    detail: str  # how allowed_bytes was computed, for the message and the notebook

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.allowed_bytes


def estimate_weight_bytes(num_parameters: int, dtype: torch.dtype) -> int:
    element = torch.tensor([], dtype=dtype).element_size()
    return int(num_parameters * element * WEIGHT_OVERHEAD)


def memory_budget(
    num_parameters: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    memory_headroom: float = 0.8,
    gpu_memory_fraction: float = 0.9,
    available_bytes: int | None = None,
) -> MemoryBudget:
    """Compute the budget; ``available_bytes`` overrides the measurement (tests, what-if planning)."""
    needed = estimate_weight_bytes(num_parameters, dtype)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        free, total = (
            (available_bytes, available_bytes) if available_bytes is not None else torch.cuda.mem_get_info(index)
        )
        allowed = int(min(free, total * gpu_memory_fraction))
        detail = f"min(free {free / GiB:.2f} GiB, total {total / GiB:.2f} GiB × {gpu_memory_fraction})"
    else:
        if available_bytes is not None:
            available, where = available_bytes, "available RAM"
        else:  # a container's memory limit, when tighter than the host (container_limits.py)
            limits = container_limits.limits()
            available, where = limits.memory_available_bytes, f"available RAM ({limits.source})"
        allowed = int(available * memory_headroom)
        detail = f"{where} {available / GiB:.2f} GiB × headroom {memory_headroom}"
    return MemoryBudget(device=str(device), needed_bytes=needed, allowed_bytes=allowed, detail=detail)


def check_memory_budget(
    label: str, num_parameters: int, dtype: torch.dtype, device: torch.device, **kwargs
) -> MemoryBudget:
    budget = memory_budget(num_parameters, dtype, device, **kwargs)
    if not budget.fits:
        dtype_name = str(dtype).removeprefix("torch.")
        raise ModelLoadError(
            f"{label} needs about {budget.needed_bytes / GiB:.2f} GiB for {num_parameters:,} parameters "
            f"in {dtype_name} "
            f"on {budget.device}, but only {budget.allowed_bytes / GiB:.2f} GiB is allowed ({budget.detail}). "
            "Free memory, choose a smaller dtype (--dtype bfloat16), or use a larger machine",
            code="insufficient_memory",
        )
    return budget


def check_host_staging(label: str, path, *, memory_headroom: float = 0.8, available_bytes: int | None = None) -> int:
    """Loading to a GPU, the host holds one shard's tensors on their way at most (the files are
    memory-mapped; what is read is page cache the kernel can drop): refuse when even the largest
    shard cannot be staged. Returns the bytes staged at most."""
    from pathlib import Path

    staged = max((f.stat().st_size for f in Path(path).glob("*.safetensors")), default=0)
    if available_bytes is None:
        available_bytes = container_limits.limits().memory_available_bytes
    allowed = int(available_bytes * memory_headroom)
    if staged > allowed:
        raise ModelLoadError(
            f"{label}: loading to the GPU stages a shard of up to {staged / GiB:.2f} GiB in host RAM, but only "
            f"{allowed / GiB:.2f} GiB is allowed ({available_bytes / GiB:.2f} GiB available × headroom "
            f"{memory_headroom}). Free host memory, or re-shard the weights into smaller files",
            code="insufficient_memory",
        )
    return staged
