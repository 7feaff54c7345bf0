"""``aieng bench serve``: the server over HTTP at several concurrencies, against itself with
batching off and (optionally) against peers: ``transformers serve --continuous-batching``,
llama.cpp's ``llama-server`` and ``llama_cpp.server`` on a GGUF of the same model
(:mod:`aieng.bench.peers`).

Every configuration gets the same prompts, the same ``max_tokens`` (EOS ignored so every request
generates exactly that many tokens), temperature 0, streamed (SSE, usage in the last chunk), a
bounded request count, and an untimed warm-up round. Servers run one at a time on loopback, so they
never compete for the cores. tok/s is completion tokens per second of wall time at that level.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from aieng.bench.engine_bench import render_prompts
from aieng.bench.load import run_load
from aieng.bench.peers import (
    PeerSpec,
    PeerUnavailable,
    check_available,
    connection_per_request,
    peer_body_extra,
    peer_server,
    peer_threads,
)
from aieng.bench.server_process import ServerProcess, ServerStartError


@dataclass
class ServeBenchConfig:
    concurrencies: tuple[int, ...] = (1, 8, 32, 64)
    max_tokens: int = 32
    requests_per_level: int = 64  # bounded: at least this many, and at least 2 x concurrency
    peers: tuple[PeerSpec, ...] = ()  # aieng.bench.peers.parse_peers
    peer_threads: int = 0  # 0: what one aieng worker's torch gets (aieng.bench.peers.peer_threads)
    peer_slots: int = 32  # llama-server parallel slots: aieng's max_batch_size
    gguf_cache: Path | None = None  # where GGUF conversions are kept (default ~/.cache/aieng/gguf)
    include_aieng: bool = True  # False: measure the peers alone
    include_batching_off: bool = True
    measure_pss: bool = True
    metrics_overhead_rounds: int = 0  # > 0: metrics on vs off at C=32, this many alternating rounds each
    plain_forward: bool = False  # also the plain batched forward at batch 32: aieng's C=32 share of it
    weight_formats: tuple[str, ...] = ("auto",)  # an aieng server per AIENG_WEIGHT_FORMATS value


@dataclass
class ServeBenchResult:
    results: dict = field(default_factory=dict)  # config -> {concurrency: LoadResult dict}
    pss: dict | None = None
    metrics_overhead: dict | None = None
    plain_forward: dict | None = None  # {"batch", "threads", "tok_s"}: the hardware's reference rate
    peer_errors: dict = field(default_factory=dict)  # peer label -> why it was not measured
    peer_info: dict = field(default_factory=dict)  # peer label -> command, threads, gguf file
    targets: dict = field(default_factory=dict)


def request_bodies(tokenizer, model_name: str, count: int, max_tokens: int, *, peer: bool | str = False) -> list[dict]:
    """The same prompts and lengths for every server; each gets its own way of ignoring EOS.

    aieng and llama-server take ``ignore_eos``; transformers serve (``peer=True`` or
    ``"transformers"``) a ``generation_config`` JSON with ``min_new_tokens``; llama_cpp.server a
    logit bias against EOS (:func:`aieng.bench.peers.peer_body_extra`). The prompts are rendered
    through the chat template and sent to ``/v1/completions``, so every server sees the same text,
    special tokens included.
    """
    prompts = render_prompts(tokenizer, count)
    extra = peer_body_extra(peer or "aieng", max_tokens, getattr(tokenizer, "eos_token_id", None))
    return [
        {
            "model": model_name,
            "prompt": p,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
        for p in prompts
    ]


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


def measure_pss(store: Path, model_ref: str, bodies_for, weight_format: str = "auto") -> dict:
    """Memory of the service with 1 and with 2 preloaded workers, after traffic, by PSS, with the
    bench's first weight format (``aieng``'s: a quantised copy is part of what is shared).

    PSS charges each shared page to its sharers in equal parts, so summing it over processes
    gives the memory they really use together. The ratio to hold to the target is the whole
    service's (master + workers): adding a worker should cost only its private memory. The
    workers-only sums are reported for reference only. Pages the master shares are charged 1/2
    to a lone worker and 2/3 to two, which would put that ratio at 4/3 or more if nothing else
    changed; but one worker and two are not the same workers (the worker plan splits the torch
    threads between them), and measured sums have come out below 1.
    """
    sizes = {}
    env = {"AIENG_WEIGHT_FORMATS": weight_format}
    for workers in (1, 2):
        with ServerProcess(store=store, model=model_ref, extra_args=["--workers", str(workers)], env=env) as proc:
            warm_up(proc.base_url, bodies_for)  # PSS after traffic, not of an idle process
            sizes[workers] = (sum(worker_pss(proc, workers)), pss_bytes(proc.process.pid))
    (one_workers, one_master), (two_workers, two_master) = sizes[1], sizes[2]
    return {
        "weight_format": weight_format,
        "one_worker_bytes": one_workers,
        "two_workers_bytes": two_workers,
        "workers_ratio": two_workers / max(1, one_workers),
        "service_one_worker_bytes": one_workers + one_master,
        "service_two_workers_bytes": two_workers + two_master,
        "ratio": (two_workers + two_master) / max(1, one_workers + one_master),
    }


def worker_pss(proc: ServerProcess, expected_workers: int) -> list[int]:
    import psutil

    master = psutil.Process(proc.process.pid)
    deadline = time.monotonic() + 60
    while len(master.children()) < expected_workers and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pss_bytes(child.pid) for child in master.children()]


def run_serve_bench(
    store: Path, model_ref: str, model_dir: Path, tokenizer, config: ServeBenchConfig, progress=None, log=print
) -> ServeBenchResult:
    name = model_ref.split("@")[0]
    bench = ServeBenchResult()

    def bodies_for(model_name, peer=False):
        return lambda n: request_bodies(tokenizer, model_name, n, config.max_tokens, peer=peer)

    first, *others = config.weight_formats
    runs = [("aieng", ["--workers", "1"], first)] if config.include_aieng else []
    if config.include_aieng and config.include_batching_off:
        runs.append(("aieng_batching_off", ["--workers", "1", "--max-batch-size", "1"], first))
    runs += [(f"aieng_{fmt}", ["--workers", "1"], fmt) for fmt in others if config.include_aieng]
    for label, args, fmt in runs:
        log(f"[bench serve] {label}: starting (AIENG_WEIGHT_FORMATS={fmt})")
        env = {"AIENG_WEIGHT_FORMATS": fmt}
        with ServerProcess(store=store, model=model_ref, extra_args=args + ["--max-queue", "1024"], env=env) as proc:
            # measure the compiled server, not the switch to it
            proc.wait_until_compiled(log=lambda message: log(f"[bench serve] {message}"))
            bench.results[label] = measure_levels(proc.base_url, bodies_for(name), config, progress)
    for spec in config.peers:
        run_peer(bench, spec, model_dir, tokenizer, config, bodies_for, progress, log)
    if config.measure_pss and config.include_aieng:
        log("[bench serve] PSS of 1 worker vs 2 preloaded workers")
        bench.pss = measure_pss(store, model_ref, bodies_for(name), first)
    if config.metrics_overhead_rounds and config.include_aieng:
        log(f"[bench serve] metrics on vs off: {config.metrics_overhead_rounds} alternating rounds at C=32")
        bench.metrics_overhead = measure_metrics_overhead(store, model_ref, bodies_for(name), config, progress)
    if config.plain_forward:
        log("[bench serve] the plain batched forward at batch 32 (the hardware's reference rate)")
        bench.plain_forward = measure_plain_forward(model_dir)
    from aieng.bench.serve_report import evaluate_targets

    bench.targets = evaluate_targets(bench)
    return bench


def measure_plain_forward(model_dir: Path, batch: int = 32) -> dict:
    """transformers' own batched forward decoding ``batch`` rows in this process, after every
    server has stopped, with the torch threads one aieng worker gets here: the rate the hardware
    gives with nothing else, the denominator of aieng's share at C=32."""
    import torch

    from aieng.bench.plain_forward import plain_decode_tokens_per_s
    from aieng.loading.loader import LoadConfig, load_folder

    threads, previous = peer_threads(0, model_dir), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        loaded = load_folder(model_dir, LoadConfig())
        rate = plain_decode_tokens_per_s(loaded.model, batch=batch)
    finally:
        torch.set_num_threads(previous)
    return {"batch": batch, "threads": threads, "tok_s": round(rate, 1)}


def run_peer(
    bench: ServeBenchResult,
    spec: PeerSpec,
    model_dir: Path,
    tokenizer,
    config: ServeBenchConfig,
    bodies_for,
    progress,
    log,
) -> None:
    """Measure one peer; a peer that is missing or fails is recorded in ``peer_errors``, not raised."""
    from aieng.bench.gguf_export import cached_export
    from aieng.model_facts import context_length
    from aieng.settings import user_cache_dir

    try:
        check_available(spec)
        gguf = None
        if spec.fmt is not None:
            cache = config.gguf_cache or user_cache_dir() / "gguf"
            log(f"[bench serve] {spec.label}: GGUF ({spec.fmt}) in {cache}")
            gguf = cached_export(model_dir, cache, spec.fmt)
        threads = peer_threads(config.peer_threads, model_dir)
        ctx = context_length(_config_dict(model_dir)) or 2048
        slot_ctx = min(ctx, max(256, config.max_tokens + 192))  # the bench's prompts are < 64 tokens
        server = peer_server(
            spec, model_dir=model_dir, gguf=gguf, threads=threads, slots=config.peer_slots, slot_ctx=slot_ctx
        )
        log(f"[bench serve] {spec.label}: starting {server.name} ({threads} threads)")
        with server, connection_per_request(spec.kind == "llama.cpp"):
            bench.peer_info[spec.label] = {
                "command": " ".join(server.command()),
                "threads": threads,
                "gguf": str(gguf) if gguf else None,
            }
            bench.results[spec.label] = measure_levels(
                server.base_url, bodies_for(str(gguf or model_dir), spec.kind), config, progress
            )
    except PeerUnavailable as exc:
        bench.peer_errors[spec.label] = str(exc)
        log(f"[bench serve] {spec.label} skipped: {exc}")
    except (RuntimeError, ServerStartError, OSError, ValueError) as exc:  # keep what was measured so far
        bench.peer_errors[spec.label] = str(exc).splitlines()[0]
        log(f"[bench serve] {spec.label}: {exc}")


def _config_dict(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def process_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (the gunicorn master and workers)."""
    import psutil

    parent = psutil.Process(pid)
    total = 0.0
    for proc in [parent, *parent.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


def measure_metrics_overhead(
    store: Path, model_ref: str, bodies_for, config: ServeBenchConfig, progress=None, concurrency: int = 32
) -> dict:
    """Two servers, identical but for ``AIENG_METRICS``, up at the same time and driven in turns
    (on, off, off, on, ...), so both see the same machine. Per round: p50 latency, req/s, and the
    server's CPU seconds per request. Latency noise between rounds is larger than the 2% being
    looked for, so the target uses each round's paired on/off ratio; CPU per request is reported
    beside it as the steadier measure of the work metrics add.
    """
    import statistics

    n = max(config.requests_per_level, 2 * concurrency)
    rounds: dict[str, list[dict]] = {"on": [], "off": []}
    with (
        ServerProcess(store=store, model=model_ref, extra_args=["--workers", "1"], env={"AIENG_METRICS": "1"}) as on,
        ServerProcess(store=store, model=model_ref, extra_args=["--workers", "1"], env={"AIENG_METRICS": "0"}) as off,
    ):
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
                rounds[label].append(
                    {
                        "latency_p50_s": result.latency_p50_s,
                        "req_per_s": result.req_per_s,
                        "cpu_ms_per_request": 1000 * cpu / max(1, result.ok),
                        "errors": result.errors,
                    }
                )

    def median(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rounds[label])

    summary = {"concurrency": concurrency, "requests_per_round": n, "rounds": rounds}
    for key in ("latency_p50_s", "req_per_s", "cpu_ms_per_request"):
        summary[f"{key}_on"], summary[f"{key}_off"] = median("on", key), median("off", key)
    summary["latency_overhead_pct"] = 100 * (summary["latency_p50_s_on"] / summary["latency_p50_s_off"] - 1)
    # Paired: each round drives both servers back to back, so its on/off ratio cancels the drift
    # of the machine between rounds; the median of those ratios is the estimate the target uses.
    summary["latency_overhead_paired_pct"] = 100 * (
        statistics.median(a["latency_p50_s"] / b["latency_p50_s"] for a, b in zip(rounds["on"], rounds["off"])) - 1
    )
    summary["cpu_overhead_pct"] = 100 * (summary["cpu_ms_per_request_on"] / summary["cpu_ms_per_request_off"] - 1)
    return summary
