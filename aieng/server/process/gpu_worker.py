"""A worker on a GPU host: its own GPU, its share of that GPU's memory, a KV budget measured there.

- **Pinning.** gunicorn's ``pre_fork`` hook (in the master, before each fork) gives the new
  worker the GPU the fewest live workers hold (``aieng.host.gpus.assign_slot``); the worker then
  serves on ``cuda:<index>``. A replaced worker's GPU goes to its replacement. With the weights
  split across GPUs (``aieng.host.gpus.split_plan``) one worker holds them all and is not pinned.
- **Memory fraction.** Applied per process (``torch.cuda.set_per_process_memory_fraction``) on
  every GPU the worker uses, before anything is allocated there.
- **KV budget.** After the weights load, one probe forward at the largest prefill the engine will
  run measures the activation peak; the static KV cache gets what is left of the fraction
  (``aieng.host.gpus.kv_budget``), less room for a second copy of the weights when hot swaps are on (a
  swap loads the next version beside this one and hands it this KV cache), and the engine admits
  only as many rows as that holds.

On a CPU host every function here returns without touching CUDA.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from aieng.host.gpus import apply_memory_fraction, assign_slot, canary_fit_problem, measure_kv_budget, pinned_device

log = logging.getLogger("aieng.server")


def pre_fork_for(slots: int):
    """The gunicorn ``pre_fork`` hook that pins worker *i* to GPU *i* among ``slots`` GPUs."""

    def pre_fork(server, worker):
        live = {pid: getattr(other, "gpu_slot", None) for pid, other in server.WORKERS.items()}
        worker.gpu_slot = assign_slot(live.values(), slots)
        # A reload (SIGHUP) forks the new workers while the old ones still hold every GPU: the new
        # one must not touch its GPU until the worker holding it has gone (release_wait).
        worker.gpu_held_by = [pid for pid, slot in live.items() if slot == worker.gpu_slot]

    return pre_fork


async def wait_for_gpu_release(
    holders: list[int], device: str, *, notify, limit_s: float, alive=None, sleep=None, clock=None
) -> bool:
    """In a new worker, before anything touches its GPU: wait until every process that held it
    (old workers draining after a reload) has exited, heart-beating meanwhile. True when released;
    False after ``limit_s`` (then the worker goes on and the memory fraction bounds the clash)."""
    import asyncio
    import time

    alive, sleep, clock = alive or process_alive, sleep or asyncio.sleep, clock or time.monotonic
    waiting = [pid for pid in holders if alive(pid)]
    if not waiting:
        return True
    log.info(
        "waiting for worker(s) %s to release %s before loading on it",
        waiting,
        device,
        extra={"event": "gpu_release_wait", "device": device},
    )
    deadline = clock() + limit_s
    while any(alive(pid) for pid in waiting):
        if clock() >= deadline:
            log.warning(
                "worker(s) %s still hold %s after %gs; loading beside them",
                [pid for pid in waiting if alive(pid)],
                device,
                limit_s,
                extra={"event": "gpu_release_timeout", "device": device},
            )
            return False
        notify()
        await sleep(0.2)
    return True


def process_alive(pid: int) -> bool:
    """Running, not a zombie (an exited worker the master has not reaped holds no GPU memory)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def pin_worker(runtime, slot: int | None) -> str:
    """In the forked worker, before the model loads: this worker's device in its settings.
    Returns the device it will use."""
    device = pinned_device(runtime.settings.device, slot)
    if device != runtime.settings.device:
        runtime.settings = replace(runtime.settings, device=device)
        runtime.config.settings = runtime.settings
        log.info("worker pinned to %s (GPU slot %d)", device, slot, extra={"event": "gpu_pinned", "device": device})
    return device


def apply_fraction(runtime) -> list[str]:
    """The memory fraction on each CUDA device this worker will use; the devices it applied to."""
    import torch

    from aieng.loading.device import wants_cuda

    settings = runtime.settings
    if not wants_cuda(settings.device):
        return []
    if runtime.gpu_split is not None:
        devices = [torch.device("cuda", index) for index in runtime.gpu_split.max_memory]
    else:
        device = torch.device("cuda" if settings.device == "auto" else settings.device)
        device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # calls that name no device (capability checks, streams) go to this GPU
        devices = [device]
    for device in devices:
        apply_memory_fraction(device, settings.gpu_memory_fraction)
    return [str(device) for device in devices]


def fit_kv_to_gpu(runtime) -> dict:
    """On CUDA, without an explicit AIENG_KV_CACHE_MB: measure what is left after the weights and
    a probe forward, and bound the engine's KV cache (and so its rows) by it. Returns the figures
    (empty off CUDA)."""
    import torch

    loaded, settings = runtime.loaded, runtime.settings
    if loaded.device.type != "cuda" or settings.kv_cache_mb:
        return {}
    split = runtime.gpu_split
    if split is not None:  # the cache follows its layers across the GPUs
        log.info(
            "weights split across %d GPUs: the KV cache and activations use the memory max_memory left "
            "free on each (%s); AIENG_KV_CACHE_MB bounds it explicitly",
            split.gpus_per_worker,
            split.reason,
            extra={"event": "kv_budget_split"},
        )
        return {}
    tokens = max(1, min(loaded.context_length, runtime.config.scheduler.max_batch_tokens))

    def probe():
        with torch.inference_mode():
            loaded.model(
                input_ids=torch.zeros((1, tokens), dtype=torch.long, device=loaded.device),
                use_cache=False,
                logits_to_keep=1,
            )  # as the engine asks: the last position's logits only

    budget, figures = measure_kv_budget(loaded.device, settings.gpu_memory_fraction, probe)
    canary_kv = 0
    if swaps_possible(settings):  # a hot swap loads the next version's weights beside these (it reuses this KV cache)
        figures["swap_reserve"] = figures["weights"]
        budget = max(0, budget - figures["weights"])
        # a canary's weights take the swap's room, and it needs a KV cache of its own beside this one
        canary_kv = int(budget * settings.canary_kv_share)
        budget -= canary_kv
        figures.update(kv_budget=budget, canary_kv=canary_kv)
    per_row = kv_bytes_per_row(loaded)
    rows = budget // per_row
    if rows < 1:
        from aieng.errors import ModelLoadError

        raise ModelLoadError(
            f"no room for one row of KV cache on {loaded.device}: {_gib(figures['total'])} × "
            f"{settings.gpu_memory_fraction} less {_gib(figures['weights'])} of weights and a "
            f"{_gib(figures['activation_peak'])} activation peak ({tokens}-token probe) leaves "
            f"{_gib(budget)}{' after room for a hot swap' if 'swap_reserve' in figures else ''}, one row needs "
            f"{_gib(per_row)}. Raise AIENG_GPU_MEMORY_FRACTION, lower AIENG_MAX_BATCH_TOKENS, serve a smaller "
            "dtype, or turn hot swaps off (AIENG_RELOAD_POLL_S=0 and no AIENG_ADMIN_TOKEN)",
            code="insufficient_memory",
        )
    engine = runtime.config.engine
    runtime.config.engine = replace(engine, kv_cache_bytes=budget, max_rows=min(engine.max_rows, int(rows)))
    if "canary_kv" in figures:
        canary_rows = min(engine.max_rows, canary_kv // per_row)
        runtime.config.canary_engine = replace(engine, kv_cache_bytes=canary_kv, max_rows=int(canary_rows))
        figures["canary_rows"] = int(canary_rows)
    figures.update(rows=int(rows), probe_tokens=tokens)
    log.info(
        "KV cache on %s: %s (%d rows of %d tokens) = %s x %s - %s weights - %s activation peak - safety%s",
        loaded.device,
        _gib(budget),
        rows,
        loaded.context_length,
        _gib(figures["total"]),
        settings.gpu_memory_fraction,
        _gib(figures["weights"]),
        _gib(figures["activation_peak"]),
        f" - {_gib(figures['swap_reserve'])} for a hot swap's or canary's weights - {_gib(canary_kv)} for a "
        f"canary's KV ({figures['canary_rows']} rows)"
        if "swap_reserve" in figures
        else "",
        extra={"event": "kv_budget_measured", **figures},
    )
    return figures


def canary_room(runtime) -> dict | None:
    """What this worker keeps for a canary on its GPU: weight bytes (the swap's room: the stable
    version's weights) and KV rows. None off CUDA, where the memory check is the load's own."""
    canary = runtime.config.canary_engine
    if canary is None or runtime.loaded is None:
        return None
    weights = sum(p.numel() * p.element_size() for p in runtime.loaded.model.parameters())
    return {"weight_bytes": weights, "kv_rows": canary.max_rows, "element_bytes": runtime.loaded.dtype.itemsize}


def check_canary_fits(runtime, num_parameters: int, label: str) -> None:
    """Refuse a canary this worker's GPU has no room for, before a byte of it is loaded."""
    room = canary_room(runtime)
    problem = canary_fit_problem(room, num_parameters) if room is not None else None
    if problem is not None:
        from aieng.errors import ModelLoadError

        raise ModelLoadError(
            f"no room for canary {label} on {runtime.loaded.device}: {problem}", code="insufficient_memory"
        )


def swaps_possible(settings) -> bool:
    """Whether this server may hot-swap (follow the store's ``current``, or POST /admin/reload):
    then a second copy of the weights must fit beside the first on the GPU."""
    return settings.reload_poll_s > 0 or bool(settings.admin_token)


def kv_bytes_per_row(loaded) -> int:
    from aieng.server.process.worker_plan import kv_cache_bytes

    return kv_cache_bytes(loaded.model.config, loaded.context_length + 1, 1, loaded.dtype.itemsize)


def _gib(value: int) -> str:
    return f"{value / 2**30:.2f} GiB"
