"""How many worker processes and torch threads a host should run: the process-model arithmetic.

The rules (why each one):
- CUDA: one worker per GPU by default. Each process holds its own CUDA context and weights
  copy in GPU memory; batching inside one process uses the GPU far better than several
  processes contending for it.
- CPU: workers × torch threads ≤ cores: oversubscribed threads spin and context-switch, and
  every process's matmuls get slower. The engine batches inside a worker, so a few wide workers
  beat many narrow ones.
- CPU threads per worker depend on what dominates a worker's time per token (``cpu_threads``):
  every token costs a fixed slice of Python outside the step (the event loop streaming it, the
  scheduler, the bridge) and a slice of compute that grows with the weight bytes a decode step
  reads. A small model's tokens are mostly that Python: a second torch thread saves less than the
  event loop loses when OpenMP threads spin on its core, so the worker keeps a core for it
  (share - 1). From ``COMPUTE_BOUND_WEIGHT_BYTES`` of weights up, matrix multiplies dominate and
  an idle core costs more than it saves: the worker gets its whole share. Where the threshold
  comes from is in ``cpu_threads``. The rule assumes the cores are the server's: on a host shared with other
  CPU work a second thread waits for a busy core at every OpenMP barrier, and one thread per
  worker can win even on a large model (set ``AIENG_TORCH_THREADS``). To compare on a host:
  ``AIENG_TORCH_THREADS=N aieng bench serve`` for each N; the servers it starts inherit it.
- Memory: each worker's private memory (activations, KV cache, interpreter) must fit beside
  the weights. With ``preload`` the weights are shared copy-on-write, so they count once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from aieng.errors import ConfigError
from aieng.host import container_limits

PER_WORKER_OVERHEAD = 384 * 2**20  # interpreter, tokenizer, HTTP stack, allocator slack

# A model with this many bytes of weights (read once per decode step) gets every core of its
# share; a smaller one leaves one to its event loop. Why this size: see cpu_threads. (16M float32
# parameters; the demo has 3 MiB, the smollm2-135m shape 406 MiB.)
COMPUTE_BOUND_WEIGHT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    torch_threads: int  # per worker
    reason: str
    gpus: int = 0  # visible GPUs when serving on CUDA: worker i is pinned to cuda:i (gpu_worker.py)
    split: object = None  # aieng.host.gpus.SplitPlan, only when the weights span several GPUs of one worker


def plan_workers(
    *,
    cores: int,
    available_bytes: int,
    weight_bytes: int,
    per_worker_bytes: int,
    device: str = "cpu",
    gpus: int = 0,
    requested: str | int = "auto",
    preload: bool = True,
    gpus_per_worker: int = 1,
) -> WorkerPlan:
    """Workers and threads per worker for ``requested`` ("auto" or a count). On CUDA, worker *i*
    is pinned to GPU *i* (``gpu_worker.py``); ``gpus_per_worker`` > 1 when the weights are split
    across GPUs (``aieng.host.gpus.split_plan``), and then one worker serves them all."""
    cores = max(1, cores)
    if requested != "auto":
        workers = int(requested)
        if workers < 1:
            raise ValueError(f"workers must be >= 1 or 'auto', got {requested}")
        if device != "cpu":
            check_gpu_workers(workers, gpus, gpus_per_worker)
            return WorkerPlan(
                workers, max(1, cores // workers), f"{workers} requested; {cores} cores split between them"
            )
        threads, why = cpu_threads(cores, workers, weight_bytes)
        return WorkerPlan(workers, threads, f"{workers} requested; {cores} cores split between them; {why}")
    if device == "cuda":
        if gpus_per_worker > 1:
            return WorkerPlan(
                1, cores, f"CUDA: the weights are split across {gpus_per_worker} GPUs, one worker serves them"
            )
        workers = max(1, gpus)
        return WorkerPlan(
            workers,
            max(1, cores // workers),
            f"CUDA: one worker per GPU, worker i on cuda:i ({gpus} GPU(s); each needs its own context)",
        )
    shared = weight_bytes if preload else 0
    private = per_worker_bytes + (0 if preload else weight_bytes)
    by_memory = max(1, (available_bytes - shared) // max(1, private))
    # Half the cores per worker, at least 1: two workers overlap HTTP/tokenization with compute.
    by_cores = max(1, cores // 2) if cores >= 2 else 1
    workers = int(min(by_memory, by_cores))
    limit = "memory" if by_memory < by_cores else "cores"
    threads, why = cpu_threads(cores, workers, weight_bytes)
    return WorkerPlan(
        workers,
        threads,
        f"min(cores/2 = {by_cores}, memory fit = {by_memory}) -> {workers} (limited by {limit}); {why}",
    )


def check_gpu_workers(workers: int, gpus: int, gpus_per_worker: int = 1) -> None:
    """Refuse a worker count that would put two workers on one GPU: each would hold its own CUDA
    context and copy of the weights, and each is allowed the memory fraction of the whole card,
    so together they overrun it (out of memory under load, not at start)."""
    if gpus_per_worker > 1 and workers > 1:
        raise ConfigError(
            f"--workers {workers}: the weights are split across {gpus_per_worker} GPUs and one worker serves "
            "them; a second worker would need as many GPUs again. Use --workers 1 (or auto)"
        )
    if gpus and workers > gpus:
        raise ConfigError(
            f"--workers {workers} on {gpus} visible GPU(s) would put two workers on one GPU, each with its own "
            f"weights and the whole memory fraction. Use --workers {gpus} or fewer (auto: one per GPU); for more "
            "throughput, raise AIENG_MAX_BATCH_SIZE: a worker batches on its GPU"
        )


def cpu_threads(cores: int, workers: int, weight_bytes: int) -> tuple[int, str]:
    """Torch threads for each of ``workers`` CPU workers, and why: the whole share
    ``cores // workers`` when the model's step is dominated by matrix multiplies (weights of at
    least ``COMPUTE_BOUND_WEIGHT_BYTES``), else the share less the core its Python needs (at least 1).

    Why the threshold: a second torch thread shortens a step by an amount that grows with the
    weights, while the event loop's Python per token stays the same. Measured per model size
    (engine decode steps at 1 and 2 threads, alternated; the table is in issue #10's note), the
    two meet a little below ``COMPUTE_BOUND_WEIGHT_BYTES`` of fp32 weights (on a host:
    ``AIENG_TORCH_THREADS=N aieng bench serve`` for each N). On a host whose cores are busy with
    other work the extra thread can lose instead: ``--torch-threads`` (or ``AIENG_TORCH_THREADS``)
    overrides the rule.
    """
    share = max(1, cores // workers)
    mib = weight_bytes / 2**20
    if weight_bytes >= COMPUTE_BOUND_WEIGHT_BYTES:
        return share, (
            f"torch threads = cores/workers = {share}: {mib:.0f} MiB of weights, a step is mostly "
            f"matrix multiplies (>= {COMPUTE_BOUND_WEIGHT_BYTES / 2**20:.0f} MiB)"
        )
    return max(1, share - 1), (
        f"torch threads = max(1, cores/workers - 1) = {max(1, share - 1)}: {mib:.0f} MiB of weights, "
        f"a step is mostly Python (< {COMPUTE_BOUND_WEIGHT_BYTES / 2**20:.0f} MiB), "
        "so a core stays with the event loop"
    )


@dataclass(frozen=True)
class MemoryNeeds:
    """What one model asks of a host's memory, as the worker plan counts it."""

    weight_bytes: int  # loaded once in the master and shared by every worker (preload)
    kv_bytes: int  # one worker's KV cache: max_batch_size rows at the full context length
    per_worker_bytes: int  # PER_WORKER_OVERHEAD + kv_bytes (+ a packed weight copy, when one may be made)


def memory_needs(settings, loaded) -> MemoryNeeds:
    """``loaded`` is the master's ``LoadedModel``, or None when weights load in the workers (CUDA)."""
    if loaded is None:
        return MemoryNeeds(0, 0, PER_WORKER_OVERHEAD)
    from aieng.loading.device import compute_dtype

    params = loaded.manifest.num_parameters if loaded.manifest else sum(p.numel() for p in loaded.model.parameters())
    kv_bytes = kv_cache_bytes(
        loaded.model.config,
        loaded.context_length,
        settings.max_batch_size,
        compute_dtype(loaded.dtype, loaded.device).itemsize,  # a ``model`` cache: fp32 on the CPU
    )
    if settings.kv_cache_mb:  # the static cache never holds more than its budget
        kv_bytes = min(kv_bytes, settings.kv_cache_mb * 2**20)
    weight_bytes = params * loaded.dtype.itemsize
    import torch

    packed_bytes = 0
    cpu, formats = loaded.device.type == "cpu", settings.weight_formats
    if formats == "auto" and loaded.dtype in (torch.float32, torch.bfloat16) and cpu:
        # Each worker may pack its own copies for the large steps (engine/native/packed_weights.py): of the
        # fp32 and the bf16 matrices, at most
        packed_bytes = params * 6
    if formats != "float32" and loaded.dtype == torch.float32 and cpu:
        weight_bytes += params * 2  # the bf16 copy small steps run in (engine/native/formats.py), at most
    if not formats.startswith("bfloat16") and loaded.dtype == torch.bfloat16 and cpu:
        weight_bytes += params * 4  # weights kept in bf16: the fp32 copy, where the plan runs a step in fp32
    return MemoryNeeds(weight_bytes, kv_bytes, PER_WORKER_OVERHEAD + kv_bytes + packed_bytes)


def plan_for_model(settings, loaded) -> WorkerPlan:
    """The plan ``aieng serve`` runs: ``plan_workers`` fed with this host and ``memory_needs``.

    ``settings.torch_threads`` (when not 0) overrides the thread count.
    """
    import torch

    from aieng.loading.device import wants_cuda

    if settings.torch_threads < 0:
        raise ConfigError(f"torch threads must be >= 0 (0 = cores // workers), got {settings.torch_threads}")
    needs = memory_needs(settings, loaded)
    gpus = torch.cuda.device_count() if wants_cuda(settings.device) else 0  # asks NVML; no CUDA context
    if gpus and settings.device.startswith("cuda:"):  # one named GPU: one worker on it, nothing to pin
        gpus = 1
    split = gpu_split(settings, gpus)
    limits = container_limits.limits()  # a container's CPU quota and memory limit, not the node's
    plan = plan_workers(
        cores=limits.cores,
        available_bytes=limits.memory_available_bytes,
        weight_bytes=needs.weight_bytes,
        per_worker_bytes=needs.per_worker_bytes,
        device="cuda" if gpus else "cpu",
        gpus=gpus,
        requested=settings.workers,
        gpus_per_worker=split.gpus_per_worker if split else 1,
    )
    if gpus:
        plan = replace(
            plan,
            gpus=gpus,
            split=split if split and split.gpus_per_worker > 1 else None,
            reason=f"{plan.reason}; {split.reason}" if split else plan.reason,
        )
    if limits.source != "host":
        plan = replace(plan, reason=f"{plan.reason}; {limits.describe()}")
    if settings.torch_threads:
        plan = replace(
            plan,
            torch_threads=settings.torch_threads,
            reason=plan.reason + f"; torch threads set to {settings.torch_threads}",
        )
    return plan


def gpu_split(settings, gpus: int):
    """On CUDA with ``device`` auto/cuda: whether the weights fit on one GPU or must be split
    (``aieng.host.gpus.split_plan``), from the manifest's parameter count and the cards' totals
    (read without a CUDA context in this process). None off CUDA or with a pinned ``cuda:N``."""
    if not gpus or settings.device not in ("auto", "cuda"):
        return None
    from aieng.host.gpus import gpu_totals, split_plan
    from aieng.store import ModelStore, parse_ref

    ref = parse_ref(settings.model)
    store = ModelStore(settings.store)
    manifest = store.manifest(type(ref)(ref.name, store.resolve(ref)))
    element = 4 if settings.dtype in ("float32", "fp32") else 2  # CUDA's auto dtype is bf16 or fp16
    return split_plan(manifest.num_parameters * element, gpu_totals(), settings.gpu_memory_fraction)


def kv_cache_bytes(config, context_length: int, rows: int, element_bytes: int) -> int:
    """Keys and values of every layer for ``rows`` sequences of ``context_length`` tokens."""
    from aieng.model_facts import kv_bytes_per_token

    return kv_bytes_per_token(config, element_bytes) * context_length * rows
