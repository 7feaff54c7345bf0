"""GPU hosts: which GPU a worker uses, how much of it aieng may take, and what it reads back.

Everything device-specific is here, in two kinds of function:

- *arithmetic* (``assign_slot``, ``pinned_device``, ``kv_budget``, ``split_plan``): pure, and
  unit-tested on a CPU host with made-up device counts and memory figures;
- *readings and settings* (``apply_memory_fraction``, ``measure_kv_budget``, ``memory_snapshot``):
  each guarded so that on a host without CUDA it returns without touching torch.cuda's runtime.

Nothing here may initialise CUDA in the gunicorn master: a child forked after ``cuInit`` cannot
use CUDA. ``torch.cuda.device_count()`` asks NVML; ``is_available()`` does too only with
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, which ``aieng serve`` sets first (``fork_safe_cuda_checks``).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger("aieng.server")

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# Segments that grow instead of new fixed-size blocks: far less fragmentation when batches and
# prompt lengths vary from step to step (the first source article sets it; PyTorch documents it).
DEFAULT_ALLOC_CONF = "expandable_segments:True"
# What activations, the sampler and the allocator's own slack may take beyond the measured warm-up
# peak, as a share of the GPU: a budget that ends at exactly the measured peak OOMs on the first
# longer prompt.
KV_SAFETY = 0.05
# With the weights split across GPUs, the share of each GPU's memory fraction they may fill.
SPLIT_WEIGHT_SHARE = 0.8


def fork_safe_cuda_checks(environ=os.environ) -> None:
    """Before the master asks anything about CUDA: ``is_available()`` through NVML instead of the
    CUDA runtime (whose ``cuInit`` would break every forked worker's CUDA), and torch's device
    numbering in PCI bus order, as NVML and nvidia-smi number them (torch's default is fastest
    first, so ``cuda:1`` and NVML's GPU 1 could be different cards)."""
    environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def default_alloc_conf(environ=os.environ) -> str:
    """Set ``PYTORCH_CUDA_ALLOC_CONF`` to expandable segments unless the user set it; before any
    process touches CUDA (``aieng serve`` calls it first). Returns the value in force."""
    environ.setdefault(ALLOC_CONF, DEFAULT_ALLOC_CONF)
    return environ[ALLOC_CONF]


def assign_slot(taken: Iterable[int | None], slots: int) -> int:
    """The GPU the fewest live workers hold, the lowest index among equals: the lowest free one
    while there is one. A worker that gunicorn replaces (killed, recycled) frees its index, and its
    replacement takes that same GPU back; more workers than GPUs (asked for) spread evenly."""
    holders = Counter(slot for slot in taken if slot is not None)
    return min(range(max(1, slots)), key=lambda slot: (holders[slot], slot))


def pinned_device(requested: str, slot: int | None) -> str:
    """The device one worker uses: ``auto``/``cuda`` with a slot → ``cuda:<slot>``. An explicit
    ``cuda:N`` or ``cpu`` is the user's choice and stays."""
    if slot is None or requested not in ("auto", "cuda"):
        return requested
    return f"cuda:{slot}"


def gpu_totals() -> list[int]:
    """Each visible GPU's memory in bytes, read without creating a CUDA context in this process
    (the gunicorn master must not have one when it forks): NVML when nvidia-ml-py is importable,
    else a short-lived child process that asks torch."""
    nvml = _nvml()
    if nvml is not None:
        try:
            import torch

            return [nvml.nvmlDeviceGetMemoryInfo(nvml_handle(nvml, i)).total for i in range(torch.cuda.device_count())]
        except Exception:
            pass
    import subprocess
    import sys

    code = (
        "import torch; print(' '.join(str(torch.cuda.get_device_properties(i).total_memory) "
        "for i in range(torch.cuda.device_count())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return [int(part) for part in out.stdout.split()] if out.returncode == 0 else []


@dataclass(frozen=True)
class SplitPlan:
    """Whether a model's weights fit on one GPU, and if not, across how many of one worker's."""

    gpus_per_worker: int
    max_memory: dict[int, int]  # device index -> bytes the weights may use there (transformers' max_memory)
    reason: str


def split_plan(weight_bytes: int, gpu_totals: list[int], fraction: float) -> SplitPlan:
    """One GPU per worker when the weights fit in ``fraction`` of one; otherwise the weights are
    split layer by layer across as many of the visible GPUs as they need (``device_map`` with
    ``max_memory``: the first source article's way), and one worker serves them all. Split, they
    may fill only ``SPLIT_WEIGHT_SHARE`` of each GPU's share: the rest is for activations and the
    KV cache, which follow their layers."""
    if not gpu_totals:
        return SplitPlan(0, {}, "no GPU")
    if weight_bytes <= gpu_totals[0] * fraction:
        return SplitPlan(1, {}, f"{weight_bytes / 2**30:.1f} GiB of weights fit in {fraction:g} of one GPU")
    room = [int(total * fraction * SPLIT_WEIGHT_SHARE) for total in gpu_totals]
    held = 0
    for need, bytes_ in enumerate(room, start=1):
        held += bytes_
        if weight_bytes <= held:
            return SplitPlan(
                need,
                dict(enumerate(room[:need])),
                f"{weight_bytes / 2**30:.1f} GiB of weights split across {need} GPUs (at most "
                f"{SPLIT_WEIGHT_SHARE:g} of {fraction:g} of each: the rest for activations and KV)",
            )
    from aieng.errors import ModelLoadError

    raise ModelLoadError(
        f"{weight_bytes / 2**30:.1f} GiB of weights do not fit in {SPLIT_WEIGHT_SHARE:g} of "
        f"{fraction:g} of all {len(gpu_totals)} GPU(s) ({held / 2**30:.1f} GiB; the rest is kept for "
        "activations and the KV cache); raise AIENG_GPU_MEMORY_FRACTION, use a smaller dtype, or a "
        "host with more GPU memory"
    )


def kv_budget(
    *, total: int, free: int, fraction: float, allocated: int, peak_activations: int, safety: float = KV_SAFETY
) -> int:
    """Bytes the static KV cache may take: this process's share of the GPU (``fraction`` of
    ``total``) less what its weights hold (``allocated``) and the activation peak a probe forward
    measured, and never more than the card has ``free`` (other processes share it) less that same
    peak; a safety share of the card is kept out of both. Never negative."""
    share = int(total * (fraction - safety)) - allocated - peak_activations
    left = free - peak_activations - int(total * safety)
    return max(0, min(share, left))


def canary_fit_problem(room: dict, num_parameters: int) -> str | None:
    """Why a canary of ``num_parameters`` does not fit the ``room`` a worker keeps for one (its
    ``canary_room``: weight bytes, KV rows, bytes per element); None when it fits. One judgement
    for the worker, before it loads, and for ``aieng release canary``, before it writes anything."""
    if room["kv_rows"] < 1:
        return "the room kept for a canary holds no KV row: raise AIENG_CANARY_KV_SHARE, or release by a hot swap"
    weights = num_parameters * room["element_bytes"]
    if weights > room["weight_bytes"]:
        return (
            f"its weights need {weights / 2**30:.2f} GiB of GPU memory; the room kept beside the stable version "
            f"holds {room['weight_bytes'] / 2**30:.2f} GiB (the stable version's weights): release it by a hot "
            "swap instead, or on larger GPUs"
        )
    return None


def apply_memory_fraction(device, fraction: float) -> bool:
    """``torch.cuda.set_per_process_memory_fraction`` on a CUDA device: the caching allocator then
    refuses (a real ``OutOfMemoryError``, which the engine splits and retries) before it takes more
    than ``fraction`` of the GPU, so workers and other processes sharing a card keep their share.
    False on any other device."""
    import torch

    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return False
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return True


def measure_kv_budget(device, fraction: float, probe) -> tuple[int, dict]:
    """On CUDA: run ``probe()`` (one forward at the largest step the engine will take) and size the
    KV budget from what is left (``kv_budget``). Returns (bytes, the figures it used); on any
    other device (0, {}), meaning no measured limit."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return 0, {}
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    allocated = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    probe()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - allocated
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    budget = kv_budget(total=total, free=free, fraction=fraction, allocated=allocated, peak_activations=peak)
    figures = {
        "total": total,
        "free": free,
        "fraction": fraction,
        "weights": allocated,
        "activation_peak": peak,
        "kv_budget": budget,
    }
    return budget, figures


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cuda:0"
    allocated: int
    reserved: int
    total: int
    utilization: float | None  # 0..1 from NVML, None where nvidia-ml-py is not importable


def memory_snapshot() -> list[DeviceMemory]:
    """Per visible GPU: what this process's tensors hold, what its allocator reserved, the card's
    total, and (with nvidia-ml-py) the card's utilisation. Empty on a host without CUDA, and in a
    process that has not initialised CUDA (asking would create a context)."""
    import torch

    if not (torch.cuda.is_initialized() and torch.cuda.is_available()):  # never the call that initialises
        return []
    nvml = _nvml()
    readings = []
    for index in range(torch.cuda.device_count()):
        utilization = None
        if nvml is not None:
            try:
                handle = nvml_handle(nvml, index)
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
            except Exception:  # a driver without the query: no reading rather than no metrics
                utilization = None
        readings.append(
            DeviceMemory(
                device=f"cuda:{index}",
                allocated=torch.cuda.memory_allocated(index),
                reserved=torch.cuda.memory_reserved(index),
                total=torch.cuda.get_device_properties(index).total_memory,
                utilization=utilization,
            )
        )
    return readings


def visible_devices(environ=os.environ) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: None when unset (every GPU, in NVML's order),
    else its entries up to the first that is not a device (CUDA ignores the rest): indices, GPU
    UUIDs (``GPU-…``, whole or a unique prefix) and MIG instances (``MIG-<uuid>``, or the older
    ``MIG-GPU-<uuid>/<gpu instance>/<compute instance>``)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for part in (p.strip() for p in value.split(",")):
        if not (part.isdigit() or part.startswith(("GPU-", "MIG-"))):
            break
        entries.append(part)
    return entries


def nvml_handle(nvml, index: int, environ=os.environ):
    """NVML's handle of torch's ``cuda:<index>``. NVML numbers every GPU on the host, torch only
    the visible ones, and the visible ones may be named by UUID or be MIG instances."""
    entries = visible_devices(environ)
    if entries is None:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    if index >= len(entries):
        raise LookupError(f"cuda:{index} is not among CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')!r}")
    entry = entries[index]
    if entry.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(entry))
    if entry.startswith("MIG-GPU-"):  # MIG-GPU-<uuid>/<gpu instance>/<compute instance>
        parent, gi, ci = entry[len("MIG-") :].split("/")
        for uuid, handle in _nvml_devices(nvml):
            if uuid.startswith("MIG-") and _mig_ids(nvml, handle) == (parent, int(gi), int(ci)):
                return handle
        raise LookupError(f"no MIG instance {entry} on this host")
    matches = [handle for uuid, handle in _nvml_devices(nvml) if uuid == entry or uuid.startswith(entry)]
    if len(matches) != 1:
        raise LookupError(f"CUDA_VISIBLE_DEVICES entry {entry!r} names {len(matches)} devices on this host, not one")
    return matches[0]


def _nvml_devices(nvml):
    """(UUID, handle) of every GPU on the host and of every MIG instance on them."""
    for i in range(nvml.nvmlDeviceGetCount()):
        gpu = nvml.nvmlDeviceGetHandleByIndex(i)
        yield _text(nvml.nvmlDeviceGetUUID(gpu)), gpu
        try:
            slots = nvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
        except nvml.NVMLError:  # MIG not supported on this card
            continue
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
            except nvml.NVMLError:  # an empty slot
                continue
            yield _text(nvml.nvmlDeviceGetUUID(mig)), mig


def _mig_ids(nvml, mig) -> tuple[str, int, int]:
    parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    gpu_instance, compute_instance = nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)
    return _text(nvml.nvmlDeviceGetUUID(parent)), gpu_instance, compute_instance


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


_NVML = None


def _forget_nvml() -> None:  # NVML's handles belong to the process that initialised it
    global _NVML
    _NVML = None


os.register_at_fork(after_in_child=_forget_nvml)


def _nvml():
    """pynvml (the nvidia-ml-py package), initialised once; None where it is missing or fails."""
    global _NVML
    if _NVML is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML = pynvml
        except Exception:
            _NVML = False
    return _NVML or None
