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

from ...polling import poll


def stream_to_end(base_url, body, results, index):
    try:
        with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as resp:
            lines = [line for line in resp.iter_lines() if line]
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        results[index] = {
            "status": resp.status_code,
            "done": lines[-1] == "data: [DONE]",
            "finish": chunks[-2]["choices"][0]["finish_reason"],
            "tokens": chunks[-1]["usage"]["completion_tokens"],
        }
    except Exception as exc:  # recorded, asserted below
        results[index] = {"error": repr(exc)}


def refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return True
    return False


def test_sigterm_drains_in_flight_streams_and_exits_zero(demo_store, render):
    """Each step waits for what it checks (readiness turning 503, the listener closing), not for
    a fixed time, so a busy machine makes the test slower, not red."""
    drain_delay_s = 2.0
    proc = ServerProcess(
        store=demo_store.root, extra_args=["--workers", "1", "--no-compile", "--drain-delay", str(drain_delay_s)]
    ).start()
    body = {
        "model": "demo",
        "prompt": render("reverse: egg fish gold"),
        "max_tokens": 120,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    results = [None] * 8
    threads = [threading.Thread(target=stream_to_end, args=(proc.base_url, body, results, i)) for i in range(8)]
    for t in threads:
        t.start()
    poll(lambda: "aieng_requests_running 8.0" in httpx.get(f"{proc.base_url}/metrics").text, timeout=10)
    os.kill(proc.process.pid, signal.SIGTERM)
    signalled = time.monotonic()
    ready = poll(lambda: (r := httpx.get(f"{proc.base_url}/health/ready")).status_code == 503 and r, timeout=10)
    assert ready and ready.json()["error"]["code"] == "not_ready" and ready.json()["status"] == "draining"
    # a lame duck: within the drain delay a balancer may not have noticed yet, and what it sends is served
    sent = time.monotonic()
    late = httpx.post(f"{proc.base_url}/v1/completions", json={**body, "stream": False, "max_tokens": 2})
    assert sent - signalled < drain_delay_s, "the late request was not even sent within the drain delay"
    assert late.status_code == 200, late.text
    # after the delay the listener is closed: the balancer retries elsewhere
    assert poll(lambda: refused(f"{proc.base_url}/health/live"), timeout=drain_delay_s + 30)
    assert time.monotonic() - signalled >= drain_delay_s * 0.9, "the listener closed before the drain delay ended"
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{proc.base_url}/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=5)
    for t in threads:
        t.join(60)
    assert proc.process.wait(60) == 0
    assert all(r and r.get("done") and r["finish"] == "length" and r["tokens"] == 120 for r in results), results


def test_a_killed_worker_is_replaced_and_the_server_keeps_answering(demo_store, render):
    """The replacement, and /metrics across it: the dead worker's counts remain (they happened),
    its live gauges are dropped."""
    from aieng.observability.scrape import scrape

    with ServerProcess(store=demo_store.root, extra_args=["--workers", "2"]) as proc:
        master = psutil.Process(proc.process.pid)
        deadline = time.monotonic() + 60
        while len(master.children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = {c.pid for c in master.children()}
        requests_before = scrape(proc.base_url).value("aieng_requests_total")
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
        snap = scrape(proc.base_url)
        assert snap.value("aieng_requests_total") >= requests_before  # counters never go backwards
        assert snap.value("aieng_queue_capacity") <= 2 * 256  # livesum: the dead worker no longer counted
