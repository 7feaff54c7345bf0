"""GPU hosts without a GPU: pinning, the plan, the split and the KV budget arithmetic with made-up
device counts and memory figures; the CUDA calls faked at torch's boundary (the code up to it runs)."""

import os
import types

import pytest
import torch

from aieng.errors import ModelLoadError
from aieng.host import gpus
from aieng.server.process.gpu_worker import fit_kv_to_gpu, pin_worker, pre_fork_for
from aieng.server.process.worker_plan import plan_workers

GiB = 2**30


class FakeArbiter:
    """What gunicorn's pre_fork hook sees: the live workers by pid."""

    def __init__(self):
        self.WORKERS = {}
        self.next_pid = 100

    def fork(self, hook):
        worker = types.SimpleNamespace()
        hook(self, worker)  # in the master, before the fork; the child inherits the attribute
        self.next_pid += 1
        self.WORKERS[self.next_pid] = worker
        return self.next_pid, worker


@pytest.mark.parametrize("count", [1, 2, 4])
def test_worker_i_is_pinned_to_gpu_i_and_a_replacement_takes_the_dead_workers_gpu(count):
    plan = plan_workers(
        cores=32, available_bytes=64 * GiB, weight_bytes=GiB, per_worker_bytes=GiB, device="cuda", gpus=count
    )
    assert plan.workers == count
    arbiter, hook = FakeArbiter(), pre_fork_for(count)
    forked = [arbiter.fork(hook) for _ in range(plan.workers)]
    slots = [worker.gpu_slot for _, worker in forked]
    assert slots == list(range(count))
    assert [gpus.pinned_device("auto", slot) for slot in slots] == [f"cuda:{i}" for i in range(count)]
    victim_pid, victim = forked[-1]
    del arbiter.WORKERS[victim_pid]  # killed; gunicorn forks a replacement
    _, replacement = arbiter.fork(hook)
    assert replacement.gpu_slot == victim.gpu_slot


def test_an_explicit_device_is_the_users_choice():
    assert gpus.pinned_device("cuda:3", 0) == "cuda:3"
    assert gpus.pinned_device("cpu", 1) == "cpu"
    assert gpus.pinned_device("cuda", 2) == "cuda:2"
    assert gpus.pinned_device("auto", None) == "auto"
    assert [gpus.assign_slot(held, 2) for held in ([0, 1], [0, 1, 0], [0, 1, 0, 1], [1, None])] == [0, 1, 0, 0]


def test_pin_worker_sets_the_device_the_worker_loads_on():
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    runtime = Runtime(RuntimeConfig(settings=Settings(device="cuda")))
    assert pin_worker(runtime, 3) == "cuda:3"
    assert runtime.settings.device == runtime.config.settings.device == "cuda:3"
    assert runtime.load_config().device == "cuda:3" and runtime.load_config().max_memory is None


def test_weights_that_fit_one_gpu_stay_on_one_and_larger_ones_are_split_across_as_few_as_needed():
    totals = [80 * GiB] * 4
    assert gpus.split_plan(60 * GiB, totals, 0.9).gpus_per_worker == 1
    two = gpus.split_plan(100 * GiB, totals, 0.9)  # each GPU takes at most 0.8 x 0.9 x 80 GiB = 57.6 GiB of weights
    assert two.gpus_per_worker == 2 and two.max_memory == {0: int(80 * GiB * 0.9 * 0.8)} | {
        1: int(80 * GiB * 0.9 * 0.8)
    }
    assert gpus.split_plan(160 * GiB, totals, 0.9).gpus_per_worker == 3
    with pytest.raises(ModelLoadError, match="do not fit in 0.8 of 0.9 of all 4 GPU"):
        gpus.split_plan(240 * GiB, totals, 0.9)  # fits the four shares (288 GiB), not with room for the KV cache
    plan = plan_workers(
        cores=32,
        available_bytes=0,
        weight_bytes=0,
        per_worker_bytes=0,
        device="cuda",
        gpus=4,
        gpus_per_worker=two.gpus_per_worker,
    )
    assert plan.workers == 1 and "split across 2 GPUs" in plan.reason


def test_kv_budget_is_the_share_left_after_weights_and_the_measured_peak_and_never_more_than_is_free():
    budget = gpus.kv_budget(
        total=80 * GiB, free=70 * GiB, fraction=0.9, allocated=14 * GiB, peak_activations=2 * GiB, safety=0.05
    )
    assert budget == int(80 * GiB * 0.85) - 16 * GiB  # 52 GiB: the share binds
    crowded = gpus.kv_budget(
        total=80 * GiB, free=20 * GiB, fraction=0.9, allocated=14 * GiB, peak_activations=2 * GiB, safety=0.05
    )
    assert crowded == 20 * GiB - 2 * GiB - int(80 * GiB * 0.05)  # another process holds the card: free binds
    assert gpus.kv_budget(total=GiB, free=GiB, fraction=0.5, allocated=GiB, peak_activations=0) == 0


def fake_cuda(monkeypatch, *, free, total, allocated, peak):
    calls = []
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: allocated)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset_peak"))
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: allocated + peak)
    monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(
        cuda,
        "set_per_process_memory_fraction",
        lambda fraction, device=None: calls.append(("fraction", fraction, str(device))),
    )
    return calls


def test_the_fraction_is_applied_on_cuda_only(monkeypatch):
    calls = fake_cuda(monkeypatch, free=0, total=0, allocated=0, peak=0)
    assert gpus.apply_memory_fraction(torch.device("cuda", 1), 0.7) is True
    assert calls == [("fraction", 0.7, "cuda:1")]
    assert gpus.apply_memory_fraction(torch.device("cpu"), 0.7) is False and len(calls) == 1


def test_the_kv_budget_is_measured_after_a_probe_forward(monkeypatch):
    calls = fake_cuda(monkeypatch, free=60 * GiB, total=80 * GiB, allocated=14 * GiB, peak=3 * GiB)
    probed = []
    budget, figures = gpus.measure_kv_budget(torch.device("cuda", 0), 0.9, lambda: probed.append(True))
    assert probed == [True] and "reset_peak" in calls
    assert figures["activation_peak"] == 3 * GiB and figures["weights"] == 14 * GiB and figures["free"] == 60 * GiB
    assert budget == gpus.kv_budget(
        total=80 * GiB, free=60 * GiB, fraction=0.9, allocated=14 * GiB, peak_activations=3 * GiB
    )
    assert gpus.measure_kv_budget(torch.device("cpu"), 0.9, lambda: probed.append(True)) == (0, {})
    assert probed == [True]  # no probe off CUDA


def runtime_on_fake_gpu(monkeypatch, tiny_shape_model_dir, budget, **settings):
    from aieng.loading.loader import LoadConfig, load_folder
    from aieng.server.process import gpu_worker
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    settings = {"max_batch_size": 32, "reload_poll_s": 0.0, **settings}
    runtime = Runtime(RuntimeConfig.from_settings(Settings(**settings)))
    runtime.loaded = load_folder(tiny_shape_model_dir, LoadConfig(device="cpu"))
    runtime.loaded.device = torch.device("cuda", 0)  # the figures below are what a GPU would report
    probes = []
    monkeypatch.setattr(
        gpu_worker,
        "measure_kv_budget",
        lambda device, fraction, probe: (
            probes.append(fraction) or budget,
            {
                "total": 80 * GiB,
                "free": 70 * GiB,
                "fraction": fraction,
                "weights": GiB,
                "activation_peak": GiB,
                "kv_budget": budget,
            },
        ),
    )
    return runtime, probes


def test_admission_holds_only_the_rows_the_measured_budget_fits(monkeypatch, tiny_shape_model_dir):
    from aieng.server.process.gpu_worker import kv_bytes_per_row

    runtime, probes = runtime_on_fake_gpu(monkeypatch, tiny_shape_model_dir, budget=0)
    per_row = kv_bytes_per_row(runtime.loaded)
    runtime, probes = runtime_on_fake_gpu(monkeypatch, tiny_shape_model_dir, budget=5 * per_row + 7)
    figures = fit_kv_to_gpu(runtime)
    assert probes == [runtime.settings.gpu_memory_fraction] and figures["rows"] == 5
    assert runtime.config.engine.max_rows == 5 and runtime.config.engine.kv_cache_bytes == 5 * per_row + 7
    runtime, _ = runtime_on_fake_gpu(monkeypatch, tiny_shape_model_dir, budget=per_row - 1)
    with pytest.raises(ModelLoadError, match="no room for one row of KV cache") as refused:
        fit_kv_to_gpu(runtime)
    assert refused.value.code == "insufficient_memory"
    # hot swaps on (the default polls the store): room for the next version's weights (1 GiB here) comes first
    runtime, _ = runtime_on_fake_gpu(
        monkeypatch, tiny_shape_model_dir, budget=GiB + 3 * per_row, reload_poll_s=1.0, canary_kv_share=0.0
    )
    figures = fit_kv_to_gpu(runtime)
    assert (
        figures["swap_reserve"] == GiB and figures["rows"] == 3 and runtime.config.engine.kv_cache_bytes == 3 * per_row
    )


def test_the_budget_keeps_a_canarys_weights_and_kv_beside_the_stable_version(monkeypatch, tiny_shape_model_dir):
    """A canary runs beside stable with a KV cache of its own: the weights' room and a share of
    the KV budget are kept for it, so loading one never breaks the memory fraction."""
    from aieng.server.process.gpu_worker import canary_room, check_canary_fits, kv_bytes_per_row

    runtime, _ = runtime_on_fake_gpu(monkeypatch, tiny_shape_model_dir, budget=0)
    per_row = kv_bytes_per_row(runtime.loaded)
    runtime, _ = runtime_on_fake_gpu(monkeypatch, tiny_shape_model_dir, budget=GiB + 10 * per_row, reload_poll_s=1.0)
    figures = fit_kv_to_gpu(runtime)  # the default share: 0.2 of what the swap's room leaves
    assert figures["canary_kv"] == 2 * per_row and figures["rows"] == 8 and figures["canary_rows"] == 2
    assert runtime.config.engine.kv_cache_bytes + runtime.config.canary_engine.kv_cache_bytes == 10 * per_row
    room = canary_room(runtime)
    params = sum(p.numel() for p in runtime.loaded.model.parameters())
    assert room == {"weight_bytes": params * 4, "kv_rows": 2, "element_bytes": 4}
    check_canary_fits(runtime, params, "tiny@2")  # a version of the same size fits
    with pytest.raises(ModelLoadError, match="its weights need") as refused:
        check_canary_fits(runtime, params * 2, "big@2")
    assert refused.value.code == "insufficient_memory"
    runtime, _ = runtime_on_fake_gpu(
        monkeypatch, tiny_shape_model_dir, budget=GiB + 10 * per_row, reload_poll_s=1.0, canary_kv_share=0.0
    )
    fit_kv_to_gpu(runtime)
    with pytest.raises(ModelLoadError, match="holds no KV row"):
        check_canary_fits(runtime, params, "tiny@2")
    assert canary_room(runtime_on_cpu(tiny_shape_model_dir)) is None  # a CPU host keeps no GPU room


def runtime_on_cpu(model_dir):
    from aieng.loading.loader import LoadConfig, load_folder
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    runtime = Runtime(RuntimeConfig.from_settings(Settings()))
    runtime.loaded = load_folder(model_dir, LoadConfig(device="cpu"))
    return runtime


def test_off_cuda_nothing_is_measured(tiny_shape_model_dir):
    from aieng.loading.loader import LoadConfig, load_folder
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    runtime = Runtime(RuntimeConfig.from_settings(Settings()))
    runtime.loaded = load_folder(tiny_shape_model_dir, LoadConfig(device="cpu"))
    before = runtime.config.engine
    assert fit_kv_to_gpu(runtime) == {} and runtime.config.engine == before


def test_a_named_gpu_gets_one_worker_and_the_master_asks_about_cuda_through_nvml(monkeypatch, tmp_path):
    from aieng.server.process.worker_plan import plan_for_model
    from aieng.settings import Settings

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    plan = plan_for_model(Settings(device="cuda:2", store=tmp_path), None)
    assert (plan.workers, plan.gpus, plan.split) == (1, 1, None)
    environ = {}
    gpus.fork_safe_cuda_checks(environ)
    assert environ == {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_expandable_segments_by_default_and_the_users_setting_wins():
    environ = {}
    assert gpus.default_alloc_conf(environ) == "expandable_segments:True"
    environ = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
    assert gpus.default_alloc_conf(environ) == "max_split_size_mb:128"


def test_gpu_metrics_per_device(monkeypatch):
    from prometheus_client import generate_latest

    from aieng.observability import metrics

    readings = [gpus.DeviceMemory("cuda:0", 10, 20, 100, 0.5), gpus.DeviceMemory("cuda:1", 1, 2, 100, None)]
    monkeypatch.setattr(gpus, "memory_snapshot", lambda: readings)
    metrics.update_resource_gauges()
    text = generate_latest().decode()
    assert 'aieng_cuda_memory_reserved_bytes{device="cuda:0"} 20.0' in text
    assert 'aieng_cuda_memory_total_bytes{device="cuda:1"} 100.0' in text
    assert 'aieng_gpu_utilization_ratio{device="cuda:0"} 0.5' in text
    assert 'aieng_gpu_utilization_ratio{device="cuda:1"}' not in text  # no NVML reading: no sample
    monkeypatch.undo()
    assert gpus.memory_snapshot() == []  # this host: no CUDA, nothing read


def test_a_reload_forks_new_workers_that_wait_for_the_old_holder_of_their_gpu():
    """SIGHUP forks the new workers while the old ones still serve: each new worker learns which
    old worker holds its GPU; a replacement for a dead worker finds its GPU free."""
    arbiter, hook = FakeArbiter(), pre_fork_for(2)
    old = [arbiter.fork(hook) for _ in range(2)]
    assert [w.gpu_held_by for _, w in old] == [[], []]  # a first start waits for nobody
    new = [arbiter.fork(hook) for _ in range(2)]  # the reload, old ones still live
    assert [(w.gpu_slot, w.gpu_held_by) for _, w in new] == [(0, [old[0][0]]), (1, [old[1][0]])]
    for pid, _ in old + new[1:]:
        del arbiter.WORKERS[pid]
    _, replacement = arbiter.fork(hook)  # new[1] died: its replacement takes GPU 1, free
    assert (replacement.gpu_slot, replacement.gpu_held_by) == (1, [])


def test_a_new_worker_waits_for_its_gpu_to_be_released_heart_beating_meanwhile():
    import asyncio

    from aieng.server.process.gpu_worker import process_alive, wait_for_gpu_release

    now, beats, gone_at = [0.0], [], {7: 3.0, 8: 1.0}

    async def sleep(seconds):
        now[0] += seconds

    def wait(limit_s):
        return asyncio.run(
            wait_for_gpu_release(
                [7, 8],
                "cuda:0",
                notify=lambda: beats.append(now[0]),
                limit_s=limit_s,
                alive=lambda pid: now[0] < gone_at[pid],
                sleep=sleep,
                clock=lambda: now[0],
            )
        )

    assert wait(limit_s=60) is True and 2.9 < now[0] < 3.3 and len(beats) >= 14  # until the last holder left
    now[0], beats[:] = 0.0, []
    assert wait(limit_s=1) is False and now[0] < 1.3  # a holder that never leaves: said, then go on
    assert process_alive(os.getpid()) and not process_alive(2**22 + 12345)
    import subprocess
    import time

    exited = subprocess.Popen(["true"])  # exits at once; not reaped yet: a zombie holds no GPU
    deadline = time.monotonic() + 10
    while process_alive(exited.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(exited.pid) and exited.poll() == 0
