"""The GPU check: everything the GPU-host path promises, run once on a host with CUDA.

    scripts/gpu_check.sh [--store DIR] [--out DIR] [--skip-big] [--requests N]

1. the host: GPUs, their memory, torch and CUDA versions, PYTORCH_CUDA_ALLOC_CONF;
2. the demo model and the smollm2-135m-shaped stand-in, built and registered in a fresh store;
3. each served by `aieng serve` (one worker per GPU): every GPU holds a worker's weights
   (per-device memory metrics), and /health/ready names a device;
4. greedy parity with transformers' generate() on the GPU (engine.parity);
5. a short `aieng bench serve` of each at C = 1 and 32;
6. a real CUDA out-of-memory: the GPU filled with ballast until one row fits and the whole batch
   does not; the engine must split, retry and finish every request (answers compared, reported);
7. the workers (``gpu_check_workers.py``): a start longer than gunicorn's timeout, a worker count
   that would share a GPU, a reload, a canary beside the stable version, GPUs named by UUID;
8. one summary, printed and written to OUT/gpu_check.json.

Exit status 0 when every check passed, 1 when one failed, 2 when this host has no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROMPTS = [
    "reverse: egg fish gold",
    "add: 12+30",
    "sort: tree king apple",
    "json: pet=cat age=4",
    "reverse: pen oak sand",
    "add: 7+8",
    "copy: blue moon",
    "sort: wolf cake jam",
]


def aieng(store: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "aieng", "--store", str(store), *args]
    print("$", " ".join(command[2:]), flush=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def host_facts() -> dict:
    import torch

    from aieng.host.gpus import default_alloc_conf

    return {
        "gpus": [
            {
                "index": i,
                "name": torch.cuda.get_device_name(i),
                "total_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
            }
            for i in range(torch.cuda.device_count())
        ],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "alloc_conf": default_alloc_conf(),
    }


def build_models(store: Path, work: Path, *, big: bool) -> dict:
    results = {"demo": aieng(store, "demo", "install").returncode == 0}
    if big:
        folder = work / "smollm2-135m"
        steps = [
            ("demo", "build", "--shape", "smollm2-135m", "--out", str(folder), "--no-progress"),
            ("model", "register", str(folder), "--name", "big", "--version", "1"),
            ("model", "promote", "big", "1", "--force", "--reason", "gpu check: a performance stand-in"),
        ]
        results["big"] = all(aieng(store, *step).returncode == 0 for step in steps)
    return results


def serve_check(store: Path, model: str, gpus: int) -> dict:
    """One worker per GPU: every GPU holds weights, and readiness names the device."""
    from prometheus_client.parser import text_string_to_metric_families

    from aieng.bench.server_process import ServerProcess

    def allocated(text: str) -> dict[str, float]:
        return {
            s.labels["device"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "aieng_cuda_memory_allocated_bytes"
        }

    body = {"model": model, "prompt": "add: 2+2", "max_tokens": 8, "temperature": 0}
    with ServerProcess(store=store, model=model, extra_args=["--workers", "auto"], ready_timeout=900) as server:
        server.wait_until_compiled()
        ready = httpx.get(f"{server.base_url}/health/ready", timeout=10).json()
        pinned: list[str] = []
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < deadline and len(pinned) < gpus:
                # requests reach every worker sooner or later; each records its GPU's memory as it steps,
                # and any worker's /metrics merges them all
                for _ in range(4 * gpus):
                    client.post(f"{server.base_url}/v1/completions", json=body)
                readings = allocated(client.get(f"{server.base_url}/metrics").text)
                pinned = sorted(device for device, value in readings.items() if value > 0)
    return {
        "ready_device": ready.get("device"),
        "devices_with_weights": pinned,
        "ok": len(pinned) == gpus and str(ready.get("device", "")).startswith("cuda"),
    }


def parity_check(store: Path, model: str) -> dict:
    from aieng.engine.chat import user_prompt
    from aieng.engine.parity import parity_report
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.store import ModelStore, parse_ref

    # float32: in bf16 the engine and generate() may round near-ties differently on the random stand-in
    loaded = load_version(ModelStore(store), parse_ref(model), LoadConfig(device="cuda:0", dtype="float32"))
    report = parity_report(loaded.model, loaded.tokenizer, [user_prompt(loaded.tokenizer, p) for p in PROMPTS])
    return {
        "prompts": report.prompts,
        "identical": report.identical,
        "ok": report.ok,
        "first_mismatches": report.mismatches[:2],
    }


def bench_check(store: Path, model: str, requests: int) -> dict:
    out = aieng(
        store,
        "bench",
        "serve",
        "--model",
        model,
        "--concurrency",
        "1,32",
        "--max-tokens",
        "64",
        "--requests",
        str(requests),
        "--no-batching-off",
        "--no-pss",
        "--json",
    )
    if out.returncode != 0:
        return {"ok": False, "error": out.stderr[-2000:]}
    return {"ok": True, "result": json.loads(out.stdout)}


def oom_check(store: Path) -> dict:
    """A real CUDA out-of-memory. 64 long prompts prefilled in large steps (prefill_chunk_tokens
    4096) need far more activation memory than one; ballast fills the GPU until one row's step
    fits and the batch's does not. The engine must split and retry until every request finishes.
    Its answers are compared with the unconstrained run's and reported, not required to match:
    on a GPU a different batch shape may pick a different kernel and round a near-tie otherwise."""
    import torch

    from aieng.engine import Engine, EngineConfig, SamplingParams
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.store import ModelStore, parse_ref

    device = torch.device("cuda", 0)
    loaded = load_version(ModelStore(store), parse_ref("demo"), LoadConfig(device=str(device), dtype="float32"))
    length = max(8, min(240, loaded.context_length - 24))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, len(loaded.tokenizer), (length,), generator=generator).tolist() for _ in range(64)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    config = EngineConfig.exact(compile=False, max_rows=len(prompts), prefill_chunk_tokens=4096)
    expected = [r.token_ids for r in Engine(loaded.model, loaded.tokenizer, config=config).generate(prompts, params)]

    def peak(rows: int) -> int:
        engine = Engine(loaded.model, loaded.tokenizer, config=config)  # its static KV cache is allocated here
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        engine.generate(prompts[:rows], params)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - base

    one, whole = peak(1), peak(len(prompts))
    if whole < 2 * one + (8 << 20):
        return {
            "ok": False,
            "error": f"the batch's peak ({whole / 2**20:.1f} MiB) is too close to one row's "
            f"({one / 2**20:.1f} MiB) to provoke an out-of-memory between them",
        }
    engine = Engine(loaded.model, loaded.tokenizer, config=config)  # its KV cache allocated before the ballast
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(device)
    room = one + (whole - one) // 4  # one row's step fits; the batch's does not
    ballast = torch.empty(max(0, free - room), dtype=torch.uint8, device=device)
    start = time.perf_counter()
    try:
        results = engine.generate(prompts, params)
        error = None
    except Exception as exc:  # reported, not raised: the summary says what happened
        results, error = [], repr(exc)
    seconds = time.perf_counter() - start
    del ballast
    torch.cuda.empty_cache()
    failed = sum(r.finish_reason == "error" for r in results)
    same = sum(r.token_ids == e for r, e in zip(results, expected))
    splits = engine.stats["oom_splits"]
    return {
        "peak_one_row_mib": round(one / 2**20, 1),
        "peak_batch_mib": round(whole / 2**20, 1),
        "room_mib": round(room / 2**20, 1),
        "oom_splits": splits,
        "requests": len(prompts),
        "failed": failed,
        "same_answers": same,
        "error": error,
        "seconds": round(seconds, 2),
        "ok": error is None and splits > 0 and len(results) == len(prompts) and failed == 0,
    }


def worker_checks(store: Path, gpus: int) -> dict:
    from aieng.host import gpu_check_workers as w

    checks = {
        "slow_start": lambda: w.slow_start_check(store),
        "worker_count": lambda: w.worker_count_check(store, gpus),
        "reload": lambda: w.reload_check(store),
        "canary_room": lambda: w.canary_room_check(store),
        "visible_by_uuid": w.visible_by_uuid_check,
    }
    results = {}
    for name, check in checks.items():
        print(f"--- workers.{name}", flush=True)
        try:
            results[name] = check()
        except Exception as exc:  # one check's failure is reported; the others still run
            results[name] = {"ok": False, "error": repr(exc)}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=None, help="a fresh store (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("var/gpu-check"), help="where gpu_check.json goes")
    parser.add_argument("--skip-big", action="store_true", help="the demo model only")
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level in the bench")
    args = parser.parse_args(argv)
    from aieng.host.gpus import default_alloc_conf

    default_alloc_conf()  # before this process initialises CUDA: the OOM check runs as the server would
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device on this host (torch.cuda.is_available() is False): nothing to check. "
            "Run it on a GPU host with the CUDA build of torch.",
            file=sys.stderr,
        )
        return 2
    work = Path(tempfile.mkdtemp(prefix="aieng-gpu-check-"))
    store = args.store or work / "store"
    os.environ.setdefault("AIENG_STORE", str(store))
    summary: dict = {"host": host_facts()}
    gpus = len(summary["host"]["gpus"])
    summary["build"] = build_models(store, work, big=not args.skip_big)
    models = [m for m in ("demo", "big") if summary["build"].get(m)]
    for model in models:
        summary[model] = {
            "serve": serve_check(store, model, gpus),
            "parity": parity_check(store, model),
            "bench": bench_check(store, model, args.requests),
        }
    summary["oom"] = oom_check(store) if "demo" in models else {"ok": False, "error": "no demo model"}
    summary["workers"] = worker_checks(store, gpus) if "demo" in models else {}
    checks = {
        f"{model}.{name}": summary[model][name]["ok"] for model in models for name in ("serve", "parity", "bench")
    }
    checks["build"] = all(summary["build"].values())
    checks["oom"] = summary["oom"]["ok"]
    checks.update({f"workers.{name}": result["ok"] for name, result in summary["workers"].items()})
    summary["checks"] = checks
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary["host"], indent=2))
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    print(f"summary: {args.out / 'gpu_check.json'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
