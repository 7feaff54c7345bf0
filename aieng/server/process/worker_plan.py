"""How many worker processes and torch threads a host should run: the process-model arithmetic.

The rules (why each one):
- CUDA: one worker per GPU by default. Each process holds its own CUDA context and weights
  copy in GPU memory; batching inside one process uses the GPU far better than several
  processes contending for it.
- CPU: workers × torch threads ≤ cores, and each worker leaves one of its cores to its own
  Python: the event loop streaming tokens and the engine thread's bookkeeping. Oversubscribed
  threads spin and context-switch, and every process's matmuls get slower; OpenMP threads that
  spin-wait on the core the event loop needs starve it (to compare on a host, run
  ``AIENG_TORCH_THREADS=N aieng bench serve`` for each N: the servers it starts inherit it).
  The engine batches inside a worker, so a few wide workers beat many narrow ones.
- Memory: each worker's private memory (activations, KV cache, interpreter) must fit beside
  the weights. With ``preload`` the weights are shared copy-on-write, so they count once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from aieng.errors import ConfigError

PER_WORKER_OVERHEAD = 384 * 2**20  # interpreter, tokenizer, HTTP stack, allocator slack


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    torch_threads: int  # per worker
    reason: str


def plan_workers(*, cores: int, available_bytes: int, weight_bytes: int, per_worker_bytes: int,
                 device: str = "cpu", gpus: int = 0, requested: str | int = "auto",
                 preload: bool = True) -> WorkerPlan:
    """Workers and threads per worker for ``requested`` ("auto" or a count)."""
    cores = max(1, cores)
    if requested != "auto":
        workers = int(requested)
        if workers < 1:
            raise ValueError(f"workers must be >= 1 or 'auto', got {requested}")
        return WorkerPlan(workers, _cpu_threads(cores, workers) if device == "cpu" else max(1, cores // workers),
                          f"{workers} requested; {cores} cores split between them")
    if device == "cuda":
        workers = max(1, gpus) if gpus > 1 else 1
        return WorkerPlan(workers, max(1, cores // workers), "CUDA: one worker per GPU (each needs its own context)")
    shared = weight_bytes if preload else 0
    private = per_worker_bytes + (0 if preload else weight_bytes)
    by_memory = max(1, (available_bytes - shared) // max(1, private))
    # Half the cores per worker, at least 1: two workers overlap HTTP/tokenization with compute.
    by_cores = max(1, cores // 2) if cores >= 2 else 1
    workers = int(min(by_memory, by_cores))
    limit = "memory" if by_memory < by_cores else "cores"
    return WorkerPlan(workers, _cpu_threads(cores, workers),
                      f"min(cores/2 = {by_cores}, memory fit = {by_memory}) -> {workers} (limited by {limit}); "
                      f"torch threads = cores/workers - 1 (one core per worker for its event loop)")


def _cpu_threads(cores: int, workers: int) -> int:
    """cores // workers, less the one core each worker's Python needs (at least 1)."""
    share = max(1, cores // workers)
    return max(1, share - 1)


@dataclass(frozen=True)
class MemoryNeeds:
    """What one model asks of a host's memory, as the worker plan counts it."""

    weight_bytes: int  # loaded once in the master and shared by every worker (preload)
    kv_bytes: int  # one worker's KV cache: max_batch_size rows at the full context length
    per_worker_bytes: int  # PER_WORKER_OVERHEAD + kv_bytes


def memory_needs(settings, loaded) -> MemoryNeeds:
    """``loaded`` is the master's ``LoadedModel``, or None when weights load in the workers (CUDA)."""
    if loaded is None:
        return MemoryNeeds(0, 0, PER_WORKER_OVERHEAD)
    params = loaded.manifest.num_parameters if loaded.manifest else sum(p.numel() for p in loaded.model.parameters())
    kv_bytes = kv_cache_bytes(loaded.model.config, loaded.context_length, settings.max_batch_size,
                              loaded.dtype.itemsize)
    return MemoryNeeds(params * loaded.dtype.itemsize, kv_bytes, PER_WORKER_OVERHEAD + kv_bytes)


def plan_for_model(settings, loaded) -> WorkerPlan:
    """The plan ``aieng serve`` runs: ``plan_workers`` fed with this host and ``memory_needs``.

    ``settings.torch_threads`` (when not 0) overrides the thread count.
    """
    import psutil
    import torch

    from aieng.loading.device import wants_cuda

    if settings.torch_threads < 0:
        raise ConfigError(f"torch threads must be >= 0 (0 = cores // workers), got {settings.torch_threads}")
    needs = memory_needs(settings, loaded)
    gpus = torch.cuda.device_count() if wants_cuda(settings.device) else 0
    plan = plan_workers(cores=os.cpu_count() or 1, available_bytes=psutil.virtual_memory().available,
                        weight_bytes=needs.weight_bytes, per_worker_bytes=needs.per_worker_bytes,
                        device="cuda" if gpus else "cpu", gpus=gpus, requested=settings.workers)
    if settings.torch_threads:
        plan = replace(plan, torch_threads=settings.torch_threads,
                       reason=plan.reason + f"; torch threads set to {settings.torch_threads}")
    return plan


def kv_cache_bytes(config, context_length: int, rows: int, element_bytes: int) -> int:
    """Keys and values of every layer for ``rows`` sequences of ``context_length`` tokens."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * context_length * rows * element_bytes
