import pytest

from aieng.server.process.worker_plan import plan_workers

GiB = 1024**3


def test_cpu_plan_keeps_threads_times_workers_within_cores():
    for cores in (1, 2, 4, 8, 16, 64):
        plan = plan_workers(cores=cores, available_bytes=64 * GiB, weight_bytes=GiB, per_worker_bytes=GiB)
        assert plan.workers * plan.torch_threads <= cores
        assert plan.workers >= 1 and plan.torch_threads >= 1


def test_each_cpu_worker_leaves_a_core_to_its_event_loop():
    assert plan_workers(cores=2, available_bytes=64 * GiB, weight_bytes=GiB, per_worker_bytes=GiB).torch_threads == 1
    assert plan_workers(cores=1, available_bytes=64 * GiB, weight_bytes=GiB, per_worker_bytes=GiB).torch_threads == 1
    assert plan_workers(cores=16, available_bytes=64 * GiB, weight_bytes=GiB, per_worker_bytes=GiB,
                        requested=2).torch_threads == 7
    assert plan_workers(cores=16, available_bytes=GiB, weight_bytes=GiB, per_worker_bytes=GiB, device="cuda",
                        gpus=1).torch_threads == 16  # GPU workers: torch threads only feed the kernels


def test_memory_limits_workers():
    plan = plan_workers(cores=16, available_bytes=5 * GiB, weight_bytes=2 * GiB, per_worker_bytes=GiB)
    assert plan.workers == 3 and "memory" in plan.reason
    no_preload = plan_workers(cores=16, available_bytes=5 * GiB, weight_bytes=2 * GiB, per_worker_bytes=GiB,
                              preload=False)
    assert no_preload.workers == 1


def test_cuda_defaults_to_one_worker_per_gpu():
    assert plan_workers(cores=32, available_bytes=GiB, weight_bytes=GiB, per_worker_bytes=GiB, device="cuda",
                        gpus=1).workers == 1


def test_explicit_count_and_bad_count():
    assert plan_workers(cores=8, available_bytes=GiB, weight_bytes=1, per_worker_bytes=1, requested=2).torch_threads == 3
    with pytest.raises(ValueError):
        plan_workers(cores=8, available_bytes=GiB, weight_bytes=1, per_worker_bytes=1, requested=0)
