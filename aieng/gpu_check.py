"""The GPU check: everything the GPU-host path promises, run once on a host with CUDA.

    scripts/gpu_check.sh [--store DIR] [--out DIR] [--skip-big] [--requests N]

1. the host: GPUs, their memory, torch and CUDA versions, PYTORCH_CUDA_ALLOC_CONF;
2. the demo model and the smollm2-135m-shaped stand-in, built and registered in a fresh store;
3. each served by `aieng serve` (one worker per GPU): every GPU holds a worker's weights
   (per-device memory metrics), and /health/ready names a device;
4. greedy parity with transformers' generate() on the GPU (engine.parity);
5. a short `aieng bench serve` of each at C = 1 and 32;
6. a real CUDA out-of-memory: the GPU filled with ballast until one row fits and the whole batch
   does not; the engine splits and retries, and its answers must equal the unconstrained run's;
7. one summary, printed and written to OUT/gpu_check.json.

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

PROMPTS = ["reverse: egg fish gold", "add: 12+30", "sort: tree king apple", "json: pet=cat age=4",
           "reverse: pen oak sand", "add: 7+8", "copy: blue moon", "sort: wolf cake jam"]


def aieng(store: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "aieng", "--store", str(store), *args]
    print("$", " ".join(command[2:]), flush=True)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def host_facts() -> dict:
    import torch

    from aieng.gpus import default_alloc_conf

    return {"gpus": [{"index": i, "name": torch.cuda.get_device_name(i),
                      "total_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                     for i in range(torch.cuda.device_count())],
            "torch": torch.__version__, "cuda": torch.version.cuda, "alloc_conf": default_alloc_conf()}


def build_models(store: Path, work: Path, *, big: bool) -> dict:
    results = {"demo": aieng(store, "demo", "install").returncode == 0}
    if big:
        folder = work / "smollm2-135m"
        steps = [("demo", "build", "--shape", "smollm2-135m", "--out", str(folder), "--no-progress"),
                 ("model", "register", str(folder), "--name", "big", "--version", "1"),
                 ("model", "promote", "big", "1", "--force", "--reason", "gpu check: a performance stand-in")]
        results["big"] = all(aieng(store, *step).returncode == 0 for step in steps)
    return results


def serve_check(store: Path, model: str, gpus: int) -> dict:
    """One worker per GPU: every GPU holds weights, and readiness names the device."""
    from prometheus_client.parser import text_string_to_metric_families

    from aieng.bench.server_process import ServerProcess

    with ServerProcess(store=store, model=model, extra_args=["--workers", "auto"], ready_timeout=900) as server:
        server.wait_until_compiled()
        ready = httpx.get(f"{server.base_url}/health/ready", timeout=10).json()
        text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    allocated = {s.labels["device"]: s.value for family in text_string_to_metric_families(text)
                 for s in family.samples if s.name == "aieng_cuda_memory_allocated_bytes"}
    pinned = sorted(device for device, value in allocated.items() if value > 0)
    return {"ready_device": ready.get("device"), "devices_with_weights": pinned,
            "ok": len(pinned) == gpus and str(ready.get("device", "")).startswith("cuda")}


def parity_check(store: Path, model: str) -> dict:
    from aieng.engine.chat import user_prompt
    from aieng.engine.parity import parity_report
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.store import ModelStore, parse_ref

    loaded = load_version(ModelStore(store), parse_ref(model), LoadConfig(device="cuda:0"))
    report = parity_report(loaded.model, loaded.tokenizer, [user_prompt(loaded.tokenizer, p) for p in PROMPTS])
    return {"prompts": report.prompts, "identical": report.identical, "ok": report.ok,
            "first_mismatches": report.mismatches[:2]}


def bench_check(store: Path, model: str, requests: int) -> dict:
    out = aieng(store, "bench", "serve", "--model", model, "--concurrency", "1,32", "--max-tokens", "64",
                "--requests", str(requests), "--no-batching-off", "--no-pss", "--json")
    if out.returncode != 0:
        return {"ok": False, "error": out.stderr[-2000:]}
    return {"ok": True, "result": json.loads(out.stdout)}


def oom_check(store: Path) -> dict:
    """A real CUDA out-of-memory: ballast leaves room for one row's prefill and not the batch's."""
    import torch

    from aieng.engine import Engine, EngineConfig, SamplingParams
    from aieng.engine.chat import user_prompt
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.store import ModelStore, parse_ref

    device = torch.device("cuda", 0)
    loaded = load_version(ModelStore(store), parse_ref("demo"), LoadConfig(device=str(device)))
    prompts = [user_prompt(loaded.tokenizer, p) for p in PROMPTS * 8]  # 64 rows
    params = SamplingParams(max_tokens=16, temperature=0)
    config = EngineConfig(compile=False, max_rows=len(prompts))
    expected = [r.token_ids for r in Engine(loaded.model, loaded.tokenizer, config=config).generate(prompts, params)]

    def peak(rows: int) -> int:
        engine = Engine(loaded.model, loaded.tokenizer, config=config)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        engine.generate(prompts[:rows], params)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - base

    one, whole = peak(1), peak(len(prompts))
    engine = Engine(loaded.model, loaded.tokenizer, config=config)  # its KV cache allocated before the ballast
    torch.cuda.empty_cache()
    free, _total = torch.cuda.mem_get_info(device)
    room = one + (whole - one) // 4  # one row fits; the batch does not
    ballast = torch.empty(max(0, free - room - (64 << 20)), dtype=torch.uint8, device=device)
    start = time.perf_counter()
    try:
        got = [r.token_ids for r in engine.generate(prompts, params)]
        error = None
    except Exception as exc:  # reported, not raised: the summary says what happened
        got, error = None, repr(exc)
    seconds = time.perf_counter() - start
    del ballast
    torch.cuda.empty_cache()
    splits = engine.stats["oom_splits"]
    return {"peak_one_row_mib": one / 2**20, "peak_batch_mib": whole / 2**20, "oom_splits": splits,
            "answers_equal": got == expected, "error": error, "seconds": round(seconds, 2),
            "ok": error is None and splits > 0 and got == expected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, default=None, help="a fresh store (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=Path("var/gpu-check"), help="where gpu_check.json goes")
    parser.add_argument("--skip-big", action="store_true", help="the demo model only")
    parser.add_argument("--requests", type=int, default=64, help="requests per concurrency level in the bench")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this host (torch.cuda.is_available() is False): nothing to check. "
              "Run it on a GPU host with the CUDA build of torch.", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="aieng-gpu-check-"))
    store = args.store or work / "store"
    os.environ.setdefault("AIENG_STORE", str(store))
    summary: dict = {"host": host_facts()}
    gpus = len(summary["host"]["gpus"])
    summary["build"] = build_models(store, work, big=not args.skip_big)
    models = [m for m in ("demo", "big") if summary["build"].get(m)]
    for model in models:
        summary[model] = {"serve": serve_check(store, model, gpus), "parity": parity_check(store, model),
                          "bench": bench_check(store, model, args.requests)}
    summary["oom"] = oom_check(store) if "demo" in models else {"ok": False, "error": "no demo model"}
    checks = {f"{model}.{name}": summary[model][name]["ok"] for model in models for name in ("serve", "parity", "bench")}
    checks["build"] = all(summary["build"].values())
    checks["oom"] = summary["oom"]["ok"]
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
