"""How many worker processes and torch threads a host should run: the process-model arithmetic.

The rules (why each one):
- CUDA: one worker per GPU by default. Each process holds its own CUDA context and weights
  copy in GPU memory; batching inside one process uses the GPU far better than several
  processes contending for it.
- CPU: workers × torch threads ≤ cores, and each worker leaves one of its cores to its own
  Python: the event loop streaming tokens and the engine thread's bookkeeping. Oversubscribed
  threads spin and context-switch, and every process's matmuls get slower; OpenMP threads that
  spin-wait on the core the event loop needs starve it. On 2 cores, 1 torch thread instead of 2
  served 1.5× the requests per second at 32 concurrent streams (`aieng bench serve`, same run).
  The engine batches inside a worker, so a few wide workers beat many narrow ones.
- Memory: each worker's private memory (activations, KV cache, interpreter) must fit beside
  the weights. With ``preload`` the weights are shared copy-on-write, so they count once.
"""

from __future__ import annotations

from dataclasses import dataclass


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
