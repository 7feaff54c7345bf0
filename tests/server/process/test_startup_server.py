"""A real ``aieng serve`` start-up as an operator sees it: /health/ready's 503 names the phase,
the log moves at least every 10 s, and a restart reuses torch.compile's on-disk cache.

Two starts of the demo model with compilation on and two torch threads (so the worker warms up
after fork, behind a listening socket, as a compute-bound model does); the compile cache is the
default, the user's ``~/.cache/aieng/compile-cache``, so only the first start on a machine
compiles cold.
"""

import json
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from aieng.bench.server_process import ServerProcess, free_port
from aieng.settings import user_cache_dir

ARGS = ["--workers", "1", "--torch-threads", "2", "--compile"]
# Warm-up waits for every graph (on busy cores compiling can pass the default 60 s budget, and a
# graph still compiling in the background when the test stops the server would miss the cache).
# One weight format: `auto` times bf16 against fp32 at start-up, and on a busy machine the two
# starts can choose differently and so compile different graphs (2 misses seen in CI).
# Three rows: three decoder graphs (2+ rows, a prompt chunk alone, 2+ rows beside a prompt chunk;
# one row runs in one kernel call), not four; the graph of several chunks is compiled in
# tests/engine/test_compile.py.
SHAPES = {"AIENG_WEIGHT_FORMATS": "float32", "AIENG_MAX_BATCH_SIZE": "3"}
ENV = {"AIENG_COMPILE_BUDGET_S": "600", **SHAPES}


def log_lines(proc):
    lines = []
    for raw in proc.output().splitlines():
        try:
            lines.append(json.loads(raw))
        except ValueError:
            lines.append({"event": "not_json", "raw": raw})
    return lines


def seconds(line):
    return datetime.strptime(line["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def start_polling(demo_store):
    """Start a server; poll /health/ready and /health/live from before it listens until it is ready."""
    proc = ServerProcess(store=demo_store.root, port=free_port(), extra_args=ARGS, env=ENV)
    polls, done = [], threading.Event()

    def poll():
        while not done.is_set():
            try:
                ready = httpx.get(f"{proc.base_url}/health/ready", timeout=2)
                live = httpx.get(f"{proc.base_url}/health/live", timeout=2)
                polls.append((ready.status_code, ready.json(), live.status_code))
            except httpx.HTTPError:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    spawned = time.time()
    thread.start()
    try:
        proc.start()
    finally:
        done.set()
        thread.join()
    return proc, polls, spawned


def test_start_up_is_visible_and_a_restart_reuses_the_compile_cache(demo_store):
    proc, polls, spawned = start_polling(demo_store)
    final = httpx.get(f"{proc.base_url}/health/ready").json()
    proc.stop()
    lines = log_lines(proc)
    assert not [line for line in lines if line["event"] == "not_json"]

    # /health/ready: 503 with the not_ready envelope and the phase while warming up; live all along
    starting = [body for status, body, _ in polls if status == 503]
    assert starting, "no 503 seen while the worker warmed up"
    warming = [body for body in starting if body["phase"] == "warmup"]
    assert warming and all(body["status"] == "starting" and body["error"]["code"] == "not_ready" for body in warming)
    assert any(body["detail"] for body in warming) and all(body["elapsed_s"] >= 0 for body in warming)
    assert all(live == 200 for _, _, live in polls)
    assert final == {"status": "ready", "model": "demo", "version": "1", "device": "cpu", "template_version": 1}

    # the log: every phase, each warm-up shape, and never silent for 10 s from spawn to ready
    started = [line["phase"] for line in lines if line["event"] == "startup_phase_start"]
    assert started == ["import", "verify", "load", "workers", "engine", "warmup"]
    loading = [line["detail"] for line in lines if line["event"] == "startup_progress" and line["phase"] == "load"]
    assert any("aieng's CPU kernels" in detail for detail in loading)  # built or loaded by the master
    kv = next(line for line in lines if line["event"] == "engine_kv_cache")
    assert kv["decode_kernel"] is True and kv["dtype"] == "torch.float32"  # the demo's one-row step is fp32
    shapes = [line["detail"] for line in lines if line["event"] == "startup_progress" and line["phase"] == "warmup"]
    graphs = [detail for detail in shapes if detail.startswith("compiling the decoder layer")]
    assert len(shapes) >= 3 and any("(1/3)" in detail for detail in graphs)  # 2+ rows, a chunk alone, both
    assert not [detail for detail in graphs if "1 decode row," in detail]  # one row runs in one call (one_row)
    ended = {line["phase"]: line["seconds"] for line in lines if line["event"] == "startup_phase_end"}
    assert set(ended) == set(started) and all(s >= 0 for s in ended.values())
    ready = next(i for i, line in enumerate(lines) if line["event"] == "startup_ready")
    stamps = [spawned] + [seconds(line) for line in lines[: ready + 1]]
    assert max(b - a for a, b in zip(stamps, stamps[1:])) <= 10.0
    plan = next(line for line in lines if line["event"] == "worker_plan")
    assert plan["torch_threads"] == 2 and "torch threads set to 2" in plan["reason"]
    # one line that says what was chosen and why, as `aieng model inspect` prints it
    chosen = next(line for line in lines if line["event"] == "serving_plan")
    assert chosen["runner"] == "native" and chosen["kv_cache"].startswith("fp32, ") and chosen["torch_threads"] == 2
    assert chosen["decode_attention"] == "aieng's CPU kernel" and "AIENG_WEIGHT_FORMATS" in chosen["weights"]
    assert chosen["message"].startswith("demo@1: native forward (") and "2 torch thread(s)" in chosen["message"]
    cache = next(line for line in lines if line["event"] == "compile_cache")
    assert cache["fx_graph_cache"] and cache["aot_autograd_cache"]
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # torch's own variable wins when set
        default = user_cache_dir() / "compile-cache"
        assert cache["dir"] == str(Path(os.environ.get("AIENG_COMPILE_CACHE_DIR", default)).resolve())

    # a restart: every compiled graph comes from the on-disk cache the first start left
    with ServerProcess(store=demo_store.root, extra_args=ARGS, env=ENV) as again:
        lines = log_lines(again)
    counts = next(
        line["compile_cache"] for line in lines if "compile_cache" in line and line["event"] == "startup_progress"
    )
    assert counts["fx_graph_hit"] > 0 and counts["fx_graph_miss"] == 0, counts


def test_a_benchmark_waits_for_a_background_compilation_before_measuring(demo_store):
    """Past its compile budget the server is ready but still compiling (phase ``compile`` on
    /health/ready): ``aieng bench serve`` waits that out, so it measures the compiled server."""
    # The first test's weight format, so its graphs come from the cache the first test left: the
    # compile still runs in the background (dynamo traces), but without minutes of C++ builds.
    proc = ServerProcess(
        store=demo_store.root, port=free_port(), extra_args=ARGS, env={"AIENG_COMPILE_BUDGET_S": "0", **SHAPES}
    )
    with proc:
        proc.wait_until_compiled(timeout=600)
        body = httpx.get(f"{proc.base_url}/health/ready").json()
    assert body == {"status": "ready", "model": "demo", "version": "1", "device": "cpu", "template_version": 1}


def test_a_worker_start_longer_than_the_worker_timeout_is_not_killed(demo_store):
    """On CUDA each worker verifies and loads the weights in its start, and gunicorn kills a worker
    silent for its timeout, starting or not: a large model would be killed and replaced forever.
    Here the start is made slower than the timeout on purpose (a CPU host loads in the master)."""
    env = {"AIENG_WORKER_TIMEOUT_S": "2", "AIENG_TEST_START_DELAY_S": "7", "AIENG_COMPILE": "0"}
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "1"], env=env, ready_timeout=120) as proc:
        answer = httpx.post(
            f"{proc.base_url}/v1/completions", json={"model": "demo", "prompt": "reverse: ab", "max_tokens": 2}
        )
        assert answer.status_code == 200, answer.text
    output = proc.output()
    assert "WORKER TIMEOUT" not in output and output.count("Booting worker") == 1, output[-3000:]
