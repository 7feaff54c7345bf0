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
from aieng.bench.server_process import ServerProcess, free_port


@dataclass
class ServeBenchConfig:
    concurrencies: tuple[int, ...] = (1, 8, 32, 64)
    max_tokens: int = 32
    requests_per_level: int = 64  # bounded: at least this many, and at least 2 x concurrency
    peer: str | None = None  # "transformers"
    include_batching_off: bool = True
    measure_pss: bool = True
    metrics_overhead_rounds: int = 0  # > 0: metrics on vs off at C=32, this many alternating rounds each


@dataclass
class ServeBenchResult:
    results: dict = field(default_factory=dict)  # config -> {concurrency: LoadResult dict}
    pss: dict | None = None
    metrics_overhead: dict | None = None
    peer_error: str | None = None
    targets: dict = field(default_factory=dict)


def request_bodies(tokenizer, model_name: str, count: int, max_tokens: int, *, peer: bool = False) -> list[dict]:
    """The same prompts and lengths for every server; each gets its own way of ignoring EOS.

    aieng takes ``ignore_eos``; transformers serve takes a ``generation_config`` JSON with
    ``min_new_tokens`` and refuses unknown fields (422), so each body carries only its server's.
    """
    prompts = render_prompts(tokenizer, count)
    if peer:
        extra = {"generation_config": json.dumps({"max_new_tokens": max_tokens, "min_new_tokens": max_tokens,
                                                  "do_sample": False})}
    else:
        extra = {"ignore_eos": True}
    return [{"model": model_name, "prompt": p, "max_tokens": max_tokens, "temperature": 0, "stream": True,
             "stream_options": {"include_usage": True}, **extra} for p in prompts]


def measure_levels(base_url: str, bodies_for, config: ServeBenchConfig, progress=None) -> dict:
    warm_up(base_url, bodies_for)
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


def warm_up(base_url: str, bodies_for) -> None:
    """An untimed round of 8 requests; a server that answers none of them is not measured."""
    warm = run_load(base_url, bodies_for(8), concurrency=8)
    if warm.ok == 0:
        raise RuntimeError(f"{base_url} answered none of the warm-up requests (status {warm.status_counts})")


def measure_pss(store: Path, model_ref: str, bodies_for) -> dict:
    """Memory of the service with 1 and with 2 preloaded workers, after traffic, by PSS.

    PSS charges each shared page to its sharers in equal parts, so summing it over processes
    gives the memory they really use together. The ratio to hold to 1.3 is the whole service's
    (master + workers): adding a worker should cost only its private memory. The workers-only
    sums are reported too, but their ratio cannot fall below 4/3 however well pages are shared:
    the master shares them as well, so one worker is charged 1/2 of them and two workers 2/3.
    """
    sizes = {}
    for workers in (1, 2):
        with ServerProcess(store=store, model=model_ref, extra_args=["--workers", str(workers)]) as proc:
            warm_up(proc.base_url, bodies_for)  # PSS after traffic, not of an idle process
            sizes[workers] = (sum(worker_pss(proc, workers)), pss_bytes(proc.process.pid))
    (one_workers, one_master), (two_workers, two_master) = sizes[1], sizes[2]
    return {"one_worker_bytes": one_workers, "two_workers_bytes": two_workers,
            "workers_ratio": two_workers / max(1, one_workers),
            "service_one_worker_bytes": one_workers + one_master, "service_two_workers_bytes": two_workers + two_master,
            "ratio": (two_workers + two_master) / max(1, one_workers + one_master)}


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

    def bodies_for(model_name, peer=False):
        return lambda n: request_bodies(tokenizer, model_name, n, config.max_tokens, peer=peer)

    runs = [("aieng", ["--workers", "1"])]
    if config.include_batching_off:
        runs.append(("aieng_batching_off", ["--workers", "1", "--max-batch-size", "1"]))
    for label, args in runs:
        log(f"[bench serve] {label}: starting")
        with ServerProcess(store=store, model=model_ref, extra_args=args + ["--max-queue", "1024"]) as proc:
            bench.results[label] = measure_levels(proc.base_url, bodies_for(name), config, progress)
    if config.peer == "transformers":
        log("[bench serve] transformers serve --continuous-batching: starting")
        try:
            with TransformersServe(model_dir) as peer:
                bench.results["transformers_cb"] = measure_levels(peer.base_url, bodies_for(str(model_dir), peer=True),
                                                                  config, progress)
        except RuntimeError as exc:  # keep what was measured so far; say why the peer is missing
            bench.peer_error = str(exc)
            log(f"[bench serve] transformers serve: {exc}")
    if config.measure_pss:
        log("[bench serve] PSS of 1 worker vs 2 preloaded workers")
        bench.pss = measure_pss(store, model_ref, bodies_for(name))
    if config.metrics_overhead_rounds:
        log(f"[bench serve] metrics on vs off: {config.metrics_overhead_rounds} alternating rounds at C=32")
        bench.metrics_overhead = measure_metrics_overhead(store, model_ref, bodies_for(name), config, progress)
    bench.targets = evaluate_targets(bench)
    return bench


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (the gunicorn master and workers)."""
    import psutil

    parent = psutil.Process(pid)
    total = 0.0
    for proc in [parent, *parent.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def measure_metrics_overhead(store: Path, model_ref: str, bodies_for, config: ServeBenchConfig,
                             progress=None, concurrency: int = 32) -> dict:
    """Two servers, identical but for ``AIENG_METRICS``, up at the same time and driven in turns
    (on, off, off, on, ...), so both see the same machine. Per round: p50 latency, req/s, and the
    server's CPU seconds per request. Latency noise between rounds is larger than the 2% being
    looked for, so the target uses each round's paired on/off ratio; CPU per request is reported
    beside it as the steadier measure of the work metrics add.
    """
    import statistics

    n = max(config.requests_per_level, 2 * concurrency)
    rounds: dict[str, list[dict]] = {"on": [], "off": []}
    with ServerProcess(store=store, model=model_ref, extra_args=["--workers", "1"], env={"AIENG_METRICS": "1"}) as on, \
            ServerProcess(store=store, model=model_ref, extra_args=["--workers", "1"], env={"AIENG_METRICS": "0"}) as off:
        servers = {"on": on, "off": off}
        for proc in servers.values():
            warm_up(proc.base_url, bodies_for)
        for round_index in range(config.metrics_overhead_rounds):
            order = ["on", "off"] if round_index % 2 == 0 else ["off", "on"]  # ABBA: going first is no advantage
            for label in order:
                proc = servers[label]
                cpu_before = process_tree_cpu_s(proc.process.pid)
                result = run_load(proc.base_url, bodies_for(n), concurrency=concurrency, progress=progress)
                cpu = process_tree_cpu_s(proc.process.pid) - cpu_before
                rounds[label].append({"latency_p50_s": result.latency_p50_s, "req_per_s": result.req_per_s,
                                      "cpu_ms_per_request": 1000 * cpu / max(1, result.ok), "errors": result.errors})

    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[label])

    summary = {"concurrency": concurrency, "requests_per_round": n, "rounds": rounds}
    for key in ("latency_p50_s", "req_per_s", "cpu_ms_per_request"):
        summary[f"{key}_on"], summary[f"{key}_off"] = median("on", key), median("off", key)
    summary["latency_overhead_pct"] = 100 * (summary["latency_p50_s_on"] / summary["latency_p50_s_off"] - 1)
    # Paired: each round drives both servers back to back, so its on/off ratio cancels the drift
    # of the machine between rounds; the median of those ratios is the estimate the target uses.
    summary["latency_overhead_paired_pct"] = 100 * (statistics.median(
        a["latency_p50_s"] / b["latency_p50_s"] for a, b in zip(rounds["on"], rounds["off"])) - 1)
    summary["cpu_overhead_pct"] = 100 * (summary["cpu_ms_per_request_on"] / summary["cpu_ms_per_request_off"] - 1)
    return summary


def evaluate_targets(bench: ServeBenchResult) -> dict:
    r = bench.results
    targets = {}
    on, off = r.get("aieng", {}), r.get("aieng_batching_off", {})
    if 32 in on and 32 in off and off[32]["ok"] and on[32]["ok"]:
        ratio = on[32]["req_per_s"] / off[32]["req_per_s"]
        targets["batching_on_over_off_c32"] = {"value": round(ratio, 2), "target": ">= 6", "met": ratio >= 6}
    if 32 in on:
        ttft = on[32]["ttft_p99_s"]
        targets["ttft_p99_c32_s"] = {"value": round(ttft, 3), "target": "<= 1.0", "met": ttft <= 1.0}
    peer = r.get("transformers_cb", {})
    for c in (32, 64):
        if c in on and c in peer and peer[c]["ok"] == 0:
            targets[f"vs_transformers_c{c}"] = {"value": None, "target": ">= 1.5 and p99 no worse", "met": False,
                                                "error": f"transformers serve answered no request: {peer[c]['status_counts']}"}
        elif c in on and c in peer:
            ratio = on[c]["req_per_s"] / peer[c]["req_per_s"]
            p99_ok = on[c]["latency_p99_s"] <= peer[c]["latency_p99_s"]
            targets[f"vs_transformers_c{c}"] = {"value": round(ratio, 2), "target": ">= 1.5 and p99 no worse",
                                                "p99_aieng_s": on[c]["latency_p99_s"],
                                                "p99_transformers_s": peer[c]["latency_p99_s"],
                                                "met": ratio >= 1.5 and p99_ok}
    if bench.metrics_overhead:
        m = bench.metrics_overhead
        targets["metrics_overhead_c32_pct"] = {
            "value": round(m["latency_overhead_paired_pct"], 2),
            "target": "< 2 (p50 latency, median of the rounds' paired on/off ratios)",
            "ratio_of_medians_pct": round(m["latency_overhead_pct"], 2),
            "cpu_overhead_pct": round(m["cpu_overhead_pct"], 2), "met": m["latency_overhead_paired_pct"] < 2}
    if bench.pss:
        targets["pss_two_over_one"] = {"value": round(bench.pss["ratio"], 2), "target": "<= 1.3 (master + workers)",
                                       "workers_only": round(bench.pss["workers_ratio"], 2),
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
        p = bench.pss
        lines.append(f"PSS, master + workers: 1 worker {p['service_one_worker_bytes'] / 2**20:.0f} MiB, 2 preloaded workers "
                     f"{p['service_two_workers_bytes'] / 2**20:.0f} MiB (ratio {p['ratio']:.2f}); workers only "
                     f"{p['one_worker_bytes'] / 2**20:.0f} vs {p['two_workers_bytes'] / 2**20:.0f} MiB "
                     f"(ratio {p['workers_ratio']:.2f}, at least 4/3 by construction)")
    if bench.metrics_overhead:
        m = bench.metrics_overhead
        lines.append(f"metrics on vs off at C={m['concurrency']} (median of {len(m['rounds']['on'])} alternating rounds): "
                     f"p50 {m['latency_p50_s_on']:.3f} s vs {m['latency_p50_s_off']:.3f} s "
                     f"({m['latency_overhead_pct']:+.1f}%; paired per round {m['latency_overhead_paired_pct']:+.1f}%), server CPU {m['cpu_ms_per_request_on']:.2f} vs "
                     f"{m['cpu_ms_per_request_off']:.2f} ms/request ({m['cpu_overhead_pct']:+.1f}%)")
    for key, t in bench.targets.items():
        lines.append(f"target {key}: {t['value']} ({t['target']}) -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)
