"""The GPU check's worker checks: what a GPU host does to workers, run for real (``gpu_check.py``).

1. **A long start is not a hung worker**: a start made slower than gunicorn's timeout
   (``AIENG_TEST_START_DELAY_S`` past ``AIENG_WORKER_TIMEOUT_S``) boots once and serves; the
   worker reuses the master's verification instead of hashing again.
2. **No GPU is shared by two workers**: ``--workers`` one more than the GPUs is refused at start.
3. **A reload releases each GPU before the new worker loads on it**: SIGHUP, then every new
   worker serves, each having waited for its GPU's old holder (``gpu_release_wait``) or found it free.
4. **A canary fits beside the stable version**: ``/admin/status`` says the room kept for one, a
   copy of the demo loads as a canary on every worker, and no GPU's reserved memory passes its
   memory fraction while both are loaded.
5. **CUDA_VISIBLE_DEVICES by UUID**: a process that sees GPU 0 by its UUID reads GPU 0's total.

Each returns a dict with ``ok`` and what it saw.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

TOKEN = "gpu-check-admin-token"


def _server(store: Path, **kwargs):
    from aieng.bench.server_process import ServerProcess

    return ServerProcess(store=store, ready_timeout=900, **kwargs)


def slow_start_check(store: Path) -> dict:
    env = {"AIENG_WORKER_TIMEOUT_S": "5", "AIENG_TEST_START_DELAY_S": "15", "AIENG_COMPILE": "0"}
    with _server(store, extra_args=["--workers", "auto"], env=env) as server:
        answer = httpx.post(
            f"{server.base_url}/v1/completions", json={"model": "demo", "prompt": "add: 2+2", "max_tokens": 4}
        )
    output = server.output()
    reused = output.count("unchanged since they were hashed before fork")
    return {
        "status": answer.status_code,
        "worker_timeouts": output.count("WORKER TIMEOUT"),
        "verifications_reused": reused,
        "ok": answer.status_code == 200 and "WORKER TIMEOUT" not in output and reused >= 1,
    }


def worker_count_check(store: Path, gpus: int) -> dict:
    command = [sys.executable, "-m", "aieng", "--store", str(store), "serve", "--workers", str(gpus + 1)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    said = "would put two workers on one GPU" in run.stderr
    return {"exit": run.returncode, "said": said, "ok": run.returncode == 1 and said}


def reload_check(store: Path) -> dict:
    with _server(store, extra_args=["--workers", "auto"], env={"AIENG_COMPILE": "0"}) as server:
        from aieng.release.reload import worker_versions

        before = set(worker_versions(server.base_url))
        os.kill(server.process.pid, signal.SIGHUP)
        deadline, after = time.monotonic() + 600, set()
        while time.monotonic() < deadline:
            after = set(worker_versions(server.base_url))
            if after and not after & before and len(after) == len(before):
                break
            time.sleep(1)
        answer = httpx.post(
            f"{server.base_url}/v1/completions", json={"model": "demo", "prompt": "add: 2+2", "max_tokens": 4}
        )
    output = server.output()
    return {
        "workers_before": sorted(before),
        "workers_after": sorted(after),
        "waited_for_release": output.count('"gpu_release_wait"'),
        "release_timeouts": output.count('"gpu_release_timeout"'),
        "ok": answer.status_code == 200
        and bool(after)
        and not after & before
        and '"gpu_release_timeout"' not in output,
    }


def canary_room_check(store: Path) -> dict:
    from aieng.release.reload import admin_reload, worker_canaries
    from aieng.store import ModelStore
    from aieng.store.canary_record import clear_canary, set_canary

    models = ModelStore(store)
    if "2" not in models.versions("demo"):
        models.register(models.version_dir("demo", models.current("demo")), "demo", "2")
    env = {"AIENG_ADMIN_TOKEN": TOKEN, "AIENG_COMPILE": "0"}
    with _server(store, extra_args=["--workers", "auto"], env=env) as server:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        room = httpx.get(f"{server.base_url}/admin/status", headers=auth, timeout=10).json().get("canary_room")
        set_canary(models, "demo", "2", 0.0, reason="gpu check: a canary beside stable")
        admin_reload(server.base_url, TOKEN)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and len(worker_canaries(server.base_url)) < len(_workers(server)):
            time.sleep(1)
        loaded = worker_canaries(server.base_url)
        over = _over_fraction(httpx.get(f"{server.base_url}/metrics").text, 0.9)
        clear_canary(models, "demo", reason="gpu check: done")
        admin_reload(server.base_url, TOKEN)
    return {
        "room": room,
        "canaries_loaded": len(loaded),
        "devices_over_fraction": over,
        "ok": bool(room) and room["kv_rows"] >= 1 and len(loaded) >= 1 and not over,
    }


def visible_by_uuid_check() -> dict:
    code = (
        "import json, torch; from aieng.host.gpus import gpu_totals, _nvml; "
        "print(json.dumps({'count': torch.cuda.device_count(), 'totals': gpu_totals(), 'nvml': _nvml() is not None}))"
    )
    first = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True)
    uuid = first.stdout.split()[0] if first.returncode == 0 and first.stdout.strip() else None
    if uuid is None:
        return {"ok": False, "error": "nvidia-smi listed no GPU UUID"}
    import torch

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    seen = json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr[-1000:]}
    total = torch.cuda.get_device_properties(0).total_memory
    return {
        "uuid": uuid,
        **seen,
        "ok": seen.get("count") == 1 and seen.get("totals") == [total] and seen.get("nvml") is True,
    }


def _workers(server) -> set[str]:
    from aieng.release.reload import worker_versions

    return set(worker_versions(server.base_url))


def _over_fraction(metrics_text: str, fraction: float) -> list[str]:
    from prometheus_client.parser import text_string_to_metric_families

    readings: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name in ("aieng_cuda_memory_reserved_bytes", "aieng_cuda_memory_total_bytes"):
                key = (s.labels.get("pid", "-"), s.labels["device"])
                readings.setdefault(key, {})[s.name] = s.value
    return [
        f"{pid} {device}"
        for (pid, device), r in readings.items()
        if r.get("aieng_cuda_memory_reserved_bytes", 0) > fraction * r.get("aieng_cuda_memory_total_bytes", 1e30)
    ]
