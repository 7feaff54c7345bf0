"""``aieng bench serve``: the server over HTTP at several concurrencies, against itself with
batching off and (optionally) against ``transformers serve --continuous-batching``.

Every configuration gets the same prompts, the same ``max_tokens`` (EOS ignored so every request
generates exactly that many tokens), temperature 0, a bounded request count, and an untimed
warm-up round. Servers run one at a time on loopback, so they never compete for the cores.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aieng.bench.engine_bench import render_prompts
from aieng.bench.load import LoadResult, run_load
from aieng.server.launcher import ServerProcess, free_port


@dataclass
class ServeBenchConfig:
    concurrencies: tuple[int, ...] = (1, 8, 32, 64)
    max_tokens: int = 32
    requests_per_level: int = 64  # bounded: at least this many, and at least 2 x concurrency
    peer: str | None = None  # "transformers"
    include_batching_off: bool = True
    measure_pss: bool = True


@dataclass
class ServeBenchResult:
    results: dict = field(default_factory=dict)  # config -> {concurrency: LoadResult dict}
    pss: dict | None = None
    targets: dict = field(default_factory=dict)


def request_bodies(tokenizer, model_name: str, count: int, max_tokens: int) -> list[dict]:
    prompts = render_prompts(tokenizer, count)
    generation = json.dumps({"max_new_tokens": max_tokens, "min_new_tokens": max_tokens, "do_sample": False})
    return [{"model": model_name, "prompt": p, "max_tokens": max_tokens, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}, "ignore_eos": True,
             "generation_config": generation}  # the last two: aieng's and transformers serve's way to ignore EOS
            for p in prompts]


def measure_levels(base_url: str, bodies_for, config: ServeBenchConfig, progress=None) -> dict:
    run_load(base_url, bodies_for(8), concurrency=8)  # warm-up round, not reported
    out = {}
    for c in config.concurrencies:
        n = max(config.requests_per_level, 2 * c)
        out[c] = run_load(base_url, bodies_for(n), concurrency=c, progress=progress).to_dict()
    return out


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss line for pid {pid}")


def worker_pss(proc: ServerProcess, expected_workers: int) -> list[int]:
    import psutil

    master = psutil.Process(proc.process.pid)
    deadline = time.monotonic() + 60
    while len(master.children()) < expected_workers and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pss_bytes(child.pid) for child in master.children()]


class TransformersServe:
    """``transformers serve <folder> --continuous-batching`` on a free loopback port."""

    def __init__(self, model_dir: Path, ready_timeout: float = 300):
        self.model_dir = model_dir
        self.port = free_port()
        self.ready_timeout = ready_timeout
        self.process = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        self.log = open(Path("/tmp") / f"transformers-serve-{self.port}.log", "wb")
        self.process = subprocess.Popen([exe, "serve", str(self.model_dir), "--continuous-batching", "--host",
                                         "127.0.0.1", "--port", str(self.port), "--device", "cpu"],
                                        stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"transformers serve exited early; see {self.log.name}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("transformers serve did not become healthy")

    def __exit__(self, *exc):
        import os

        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def run_serve_bench(store: Path, model_ref: str, model_dir: Path, tokenizer, config: ServeBenchConfig,
                    progress=None, log=print) -> ServeBenchResult:
    name = model_ref.split("@")[0]
    bench = ServeBenchResult()

    def bodies_for(model_name):
        return lambda n: request_bodies(tokenizer, model_name, n, config.max_tokens)

    runs = [("aieng", ["--workers", "1"])]
    if config.include_batching_off:
        runs.append(("aieng_batching_off", ["--workers", "1", "--max-batch-size", "1"]))
    for label, args in runs:
        log(f"[bench serve] {label}: starting")
        with ServerProcess(store=store, model=model_ref, extra_args=args + ["--max-queue", "1024"]) as proc:
            bench.results[label] = measure_levels(proc.base_url, bodies_for(name), config, progress)
    if config.peer == "transformers":
        log("[bench serve] transformers serve --continuous-batching: starting")
        with TransformersServe(model_dir) as peer:
            bench.results["transformers_cb"] = measure_levels(peer.base_url, bodies_for(str(model_dir)), config, progress)
    if config.measure_pss:
        log("[bench serve] PSS of 1 worker vs 2 preloaded workers")
        with ServerProcess(store=store, model=model_ref, extra_args=["--workers", "1"]) as one:
            single = worker_pss(one, 1)
        with ServerProcess(store=store, model=model_ref, extra_args=["--workers", "2"]) as two:
            run_load(two.base_url, bodies_for(name)(8), concurrency=8)
            pair = worker_pss(two, 2)
        bench.pss = {"one_worker_bytes": sum(single), "two_workers_bytes": sum(pair),
                     "ratio": sum(pair) / max(1, sum(single))}
    bench.targets = evaluate_targets(bench)
    return bench


def evaluate_targets(bench: ServeBenchResult) -> dict:
    r = bench.results
    targets = {}
    on, off = r.get("aieng", {}), r.get("aieng_batching_off", {})
    if 32 in on and 32 in off:
        ratio = on[32]["req_per_s"] / off[32]["req_per_s"]
        targets["batching_on_over_off_c32"] = {"value": round(ratio, 2), "target": ">= 6", "met": ratio >= 6}
    if 32 in on:
        ttft = on[32]["ttft_p99_s"]
        targets["ttft_p99_c32_s"] = {"value": round(ttft, 3), "target": "<= 1.0", "met": ttft <= 1.0}
    peer = r.get("transformers_cb", {})
    for c in (32, 64):
        if c in on and c in peer:
            ratio = on[c]["req_per_s"] / peer[c]["req_per_s"]
            p99_ok = on[c]["latency_p99_s"] <= peer[c]["latency_p99_s"]
            targets[f"vs_transformers_c{c}"] = {"value": round(ratio, 2), "target": ">= 1.5 and p99 no worse",
                                                "p99_aieng_s": on[c]["latency_p99_s"],
                                                "p99_transformers_s": peer[c]["latency_p99_s"],
                                                "met": ratio >= 1.5 and p99_ok}
    if bench.pss:
        targets["pss_two_over_one"] = {"value": round(bench.pss["ratio"], 2), "target": "<= 1.3",
                                       "met": bench.pss["ratio"] <= 1.3}
    return targets


def format_table(bench: ServeBenchResult) -> str:
    lines = [f"{'config':20} {'C':>4} {'req/s':>8} {'tok/s':>9} {'p50 s':>7} {'p99 s':>7} {'ttft50':>7} {'ttft99':>7} "
             f"{'tok/req':>7} {'err':>4}"]
    for label, levels in bench.results.items():
        for c, m in levels.items():
            lines.append(f"{label:20} {c:>4} {m['req_per_s']:8.2f} {m['output_tok_per_s']:9.1f} {m['latency_p50_s']:7.3f} "
                         f"{m['latency_p99_s']:7.3f} {m['ttft_p50_s']:7.3f} {m['ttft_p99_s']:7.3f} "
                         f"{m['mean_completion_tokens']:7.1f} {m['errors']:>4}")
    if bench.pss:
        lines.append(f"PSS: one worker {bench.pss['one_worker_bytes'] / 2**20:.0f} MiB, two preloaded workers "
                     f"{bench.pss['two_workers_bytes'] / 2**20:.0f} MiB (ratio {bench.pss['ratio']:.2f})")
    for key, t in bench.targets.items():
        lines.append(f"target {key}: {t['value']} ({t['target']}) -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)
