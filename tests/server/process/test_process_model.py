"""gunicorn process model: graceful drain on SIGTERM, worker replacement after SIGKILL."""

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from aieng.bench.server_process import ServerProcess


def stream_to_end(base_url, body, results, index):
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as resp:
            lines = [line for line in resp.iter_lines() if line]
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        results[index] = {"status": resp.status_code, "done": lines[-1] == "data: [DONE]",
                          "finish": chunks[-2]["choices"][0]["finish_reason"],
                          "tokens": chunks[-1]["usage"]["completion_tokens"]}
    except Exception as exc:  # recorded, asserted below
        results[index] = {"error": repr(exc)}


def test_sigterm_drains_in_flight_streams_and_exits_zero(demo_store, render):
    proc = ServerProcess(store=demo_store.root, extra_args=["--workers", "1", "--drain-delay", "1.0"]).start()
    body = {"model": "demo", "prompt": render("reverse: egg fish gold"), "max_tokens": 120, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    results = [None] * 8
    threads = [threading.Thread(target=stream_to_end, args=(proc.base_url, body, results, i)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "aieng_requests_running 8.0" not in httpx.get(f"{proc.base_url}/metrics").text:
        time.sleep(0.02)
    os.kill(proc.process.pid, signal.SIGTERM)
    signalled = time.monotonic()
    time.sleep(0.3)
    ready = httpx.get(f"{proc.base_url}/health/ready")
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
    assert ready.json()["status"] == "draining"
    # a lame duck: within the drain delay a balancer may not have noticed yet, and what it sends is served
    late = httpx.post(f"{proc.base_url}/v1/completions", json={**body, "stream": False, "max_tokens": 2})
    assert late.status_code == 200 and time.monotonic() - signalled < 1.0
    time.sleep(max(0.0, 1.3 - (time.monotonic() - signalled)))
    with pytest.raises(httpx.TransportError):  # after the delay the listener is closed: the balancer retries elsewhere
        httpx.post(f"{proc.base_url}/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=5)
    for t in threads:
        t.join(60)
    assert proc.process.wait(60) == 0
    assert all(r and r.get("done") and r["finish"] == "length" and r["tokens"] == 120 for r in results), results


def test_a_killed_worker_is_replaced_and_the_server_keeps_answering(demo_store, render):
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "2"]) as proc:
        master = psutil.Process(proc.process.pid)
        deadline = time.monotonic() + 60
        while len(master.children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = {c.pid for c in master.children()}
        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)
        body = {"model": "demo", "prompt": render("add: 22+22"), "max_tokens": 4, "temperature": 0}
        answers = [httpx.post(f"{proc.base_url}/v1/completions", json=body, timeout=30) for _ in range(5)]
        assert all(a.status_code == 200 and a.json()["choices"][0]["text"] == "44" for a in answers)
        while time.monotonic() < deadline:
            after = {c.pid for c in master.children()}
            if len(after) == 2 and victim not in after:
                break
            time.sleep(0.1)
        assert victim not in after and len(after) == 2
