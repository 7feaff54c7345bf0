import pytest

from aieng.errors import ConfigError
from aieng.server.process.worker_plan import COMPUTE_BOUND_WEIGHT_BYTES, plan_workers

GiB = 1024**3
MiB = 1024**2
SMALL = 3 * MiB  # the demo model: a step is mostly Python
LARGE = 426 * MiB  # 106M parameters in float32 (the smollm2-135m shape): a step is mostly matmuls


def test_cpu_plan_keeps_threads_times_workers_within_cores_for_both_kinds_of_model():
    for weights in (SMALL, LARGE):
        for cores in (1, 2, 4, 8, 16, 64):
            for requested in ("auto", 1, 3):
                plan = plan_workers(
                    cores=cores,
                    available_bytes=64 * GiB,
                    weight_bytes=weights,
                    per_worker_bytes=GiB,
                    requested=requested,
                )
                assert plan.torch_threads >= 1
                assert plan.workers * plan.torch_threads <= max(cores, plan.workers), plan


def test_a_small_models_worker_leaves_a_core_to_its_event_loop():
    plan = plan_workers(cores=2, available_bytes=64 * GiB, weight_bytes=SMALL, per_worker_bytes=GiB)
    assert (plan.workers, plan.torch_threads) == (1, 1) and "event loop" in plan.reason
    assert plan_workers(cores=1, available_bytes=64 * GiB, weight_bytes=SMALL, per_worker_bytes=GiB).torch_threads == 1
    assert (
        plan_workers(
            cores=16, available_bytes=64 * GiB, weight_bytes=SMALL, per_worker_bytes=GiB, requested=2
        ).torch_threads
        == 7
    )


def test_a_compute_bound_models_worker_gets_all_cores_of_its_share():
    plan = plan_workers(cores=2, available_bytes=64 * GiB, weight_bytes=LARGE, per_worker_bytes=GiB)
    assert (plan.workers, plan.torch_threads) == (1, 2) and "matrix multiplies" in plan.reason
    assert (
        plan_workers(
            cores=16, available_bytes=64 * GiB, weight_bytes=LARGE, per_worker_bytes=GiB, requested=2
        ).torch_threads
        == 8
    )
    assert plan_workers(cores=8, available_bytes=64 * GiB, weight_bytes=LARGE, per_worker_bytes=GiB).torch_threads == 2


def test_the_threshold_separates_the_two_kinds():
    below = plan_workers(
        cores=4,
        available_bytes=64 * GiB,
        weight_bytes=COMPUTE_BOUND_WEIGHT_BYTES - 1,
        per_worker_bytes=GiB,
        requested=1,
    )
    at = plan_workers(
        cores=4, available_bytes=64 * GiB, weight_bytes=COMPUTE_BOUND_WEIGHT_BYTES, per_worker_bytes=GiB, requested=1
    )
    assert (below.torch_threads, at.torch_threads) == (3, 4)
    assert SMALL < COMPUTE_BOUND_WEIGHT_BYTES <= LARGE


def test_gpu_workers_get_every_core():
    assert (
        plan_workers(
            cores=16, available_bytes=GiB, weight_bytes=GiB, per_worker_bytes=GiB, device="cuda", gpus=1
        ).torch_threads
        == 16
    )  # GPU workers: torch threads only feed the kernels


def test_memory_limits_workers():
    plan = plan_workers(cores=16, available_bytes=5 * GiB, weight_bytes=2 * GiB, per_worker_bytes=GiB)
    assert plan.workers == 3 and "memory" in plan.reason
    no_preload = plan_workers(
        cores=16, available_bytes=5 * GiB, weight_bytes=2 * GiB, per_worker_bytes=GiB, preload=False
    )
    assert no_preload.workers == 1


def test_cuda_defaults_to_one_worker_per_gpu():
    assert (
        plan_workers(
            cores=32, available_bytes=GiB, weight_bytes=GiB, per_worker_bytes=GiB, device="cuda", gpus=1
        ).workers
        == 1
    )


def test_explicit_count_and_bad_count():
    assert (
        plan_workers(cores=8, available_bytes=GiB, weight_bytes=1, per_worker_bytes=1, requested=2).torch_threads == 3
    )
    assert (
        plan_workers(cores=8, available_bytes=GiB, weight_bytes=LARGE, per_worker_bytes=1, requested=2).torch_threads
        == 4
    )
    with pytest.raises(ValueError):
        plan_workers(cores=8, available_bytes=GiB, weight_bytes=1, per_worker_bytes=1, requested=0)


@pytest.mark.parametrize(
    "stored, formats, copies",
    [
        ("float32", "float32", (0, 0)),
        ("float32", "bfloat16", (2, 0)),
        ("float32", "auto", (2, 6)),
        ("bfloat16", "bfloat16", (0, 0)),
        ("bfloat16", "float32", (4, 0)),
        ("bfloat16", "auto", (4, 6)),
    ],
)
def test_memory_needs_count_the_weight_copies_the_formats_may_make(stored, formats, copies):
    """A copy in the other float format (made once, before the workers fork: bf16 of fp32 weights,
    fp32 of a checkpoint kept in bf16) and, with ``auto``, the packed copies of the fp32 and bf16
    matrices each worker may make for itself (engine/native/packed_weights.py). The KV cache is
    counted in fp32, what activations run in on the CPU, whatever the weights are stored in."""
    from types import SimpleNamespace

    import torch

    from aieng.server.process.worker_plan import PER_WORKER_OVERHEAD, memory_needs
    from aieng.settings import Settings

    params = 1_000_000
    config = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64)
    loaded = SimpleNamespace(
        manifest=SimpleNamespace(num_parameters=params),
        model=SimpleNamespace(config=config),
        context_length=128,
        dtype=getattr(torch, stored),
        device=torch.device("cpu"),
    )
    needs = memory_needs(Settings(weight_formats=formats, max_batch_size=4), loaded)
    assert needs.weight_bytes == params * (loaded.dtype.itemsize + copies[0])
    assert needs.kv_bytes == 2 * 2 * 2 * 16 * 4 * 128 * 4  # k and v, layers, KV heads, head_dim, rows, tokens, fp32
    assert needs.per_worker_bytes == PER_WORKER_OVERHEAD + needs.kv_bytes + params * copies[1]


@pytest.mark.parametrize(
    "workers, gpus, per_worker, message",
    [
        (3, 2, 1, "--workers 3 on 2 visible GPU\\(s\\) would put two workers on one GPU"),
        (2, 1, 1, "Use --workers 1 or fewer"),
        (2, 4, 2, "split across 2 GPUs and one worker serves them"),
    ],
)
def test_an_explicit_gpu_worker_count_that_would_share_a_gpu_is_refused(workers, gpus, per_worker, message):
    with pytest.raises(ConfigError, match=message):
        plan_workers(
            cores=32,
            available_bytes=64 * GiB,
            weight_bytes=GiB,
            per_worker_bytes=GiB,
            device="cuda",
            gpus=gpus,
            requested=workers,
            gpus_per_worker=per_worker,
        )


def test_an_explicit_gpu_worker_count_that_fits_is_kept():
    plan = plan_workers(
        cores=32, available_bytes=GiB, weight_bytes=GiB, per_worker_bytes=GiB, device="cuda", gpus=4, requested=2
    )
    assert (plan.workers, plan.torch_threads) == (2, 16)
