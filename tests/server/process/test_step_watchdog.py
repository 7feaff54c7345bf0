"""A wedged engine step: logged with its shape, the worker turns unready, and it is replaced.

The wedge is the test-only step delay (``AIENG_TEST_STEP_DELAY``: a sleep inside every engine
step of one version), made longer than ``AIENG_STEP_TIMEOUT_S``: nothing else makes a real
engine step hang on purpose.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from aieng.bench.server_process import ServerProcess
from aieng.server.process.step_watchdog import StepWatchdog


def _runtime_with_a_step_started_at(started: float | None):
    loop = SimpleNamespace(step_started=started, step_shape=lambda: {"running_rows": 3, "joining_rows": 1})
    serving = SimpleNamespace(
        name="demo", version="7", engine_loop=loop, engine=SimpleNamespace(compiling_inline=False)
    )
    return SimpleNamespace(serving=serving, canary=None, stuck=None)


def test_a_step_past_the_timeout_marks_the_runtime_stuck_and_logs_its_shape(caplog):
    runtime = _runtime_with_a_step_started_at(100.0)
    watchdog = StepWatchdog(runtime, 5.0, exit_after_s=0.0)
    assert not watchdog.check(now=104.9) and runtime.stuck is None  # a slow step is not a stuck one
    assert watchdog.check(now=105.5)
    assert "demo@7" in runtime.stuck and "AIENG_STEP_TIMEOUT_S=5" in runtime.stuck
    record = next(r for r in caplog.records if getattr(r, "event", None) == "engine_step_stuck")
    assert record.running_rows == 3 and record.joining_rows == 1 and record.step_age_s == 5.5


def test_an_idle_engine_is_never_stuck():
    runtime = _runtime_with_a_step_started_at(None)
    assert not StepWatchdog(runtime, 0.1, exit_after_s=0.0).check(now=1e9)


def test_the_watchdog_thread_calls_on_stuck_after_the_exit_delay():
    runtime = _runtime_with_a_step_started_at(time.monotonic() - 10)
    called = threading.Event()
    watchdog = StepWatchdog(runtime, 1.0, exit_after_s=0.2, poll_s=0.05, on_stuck=called.set).start()
    assert watchdog.fired.wait(2) and called.wait(2)


@pytest.mark.timeout(240)
def test_a_wedged_worker_turns_unready_and_gunicorn_replaces_it(demo_store):
    env = {
        "AIENG_STEP_TIMEOUT_S": "1",
        "AIENG_TEST_STEP_DELAY": "1=4",
        "AIENG_DRAIN_DELAY_S": "0.5",
        "AIENG_GRACEFUL_TIMEOUT_S": "2",
        "AIENG_RELOAD_POLL_S": "0",
    }
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "1", "--no-compile"], env=env) as server:
        url = server.base_url
        booted = server.output().count("Booting worker")
        body = {"model": "demo", "prompt": "add: 1+2", "max_tokens": 4, "temperature": 0}
        threading.Thread(target=lambda: httpx.post(f"{url}/v1/completions", json=body, timeout=30), daemon=True).start()
        deadline, seen = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            resp = httpx.get(f"{url}/health/ready", timeout=5)
            if resp.status_code == 503 and resp.json().get("status") == "stuck":
                seen = resp.json()
                break
            time.sleep(0.1)
        assert seen is not None, server.output()[-3000:]
        assert seen["error"]["code"] == "engine_stuck" and "being replaced" in seen["error"]["message"]
        refused = httpx.post(f"{url}/v1/completions", json=body, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_stuck"
        lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
        stuck = [line for line in lines if line.get("event") == "engine_step_stuck"]
        assert stuck and stuck[0]["running_rows"] + stuck[0]["joining_rows"] >= 1, stuck
        while time.monotonic() < deadline + 60 and server.output().count("Booting worker") == booted:
            time.sleep(0.2)
        assert server.output().count("Booting worker") > booted, "gunicorn did not start a fresh worker"
        while time.monotonic() < deadline + 90:  # the fresh worker warms up and serves
            resp = httpx.get(f"{url}/health/ready", timeout=5)
            if resp.status_code == 200:
                break
            time.sleep(0.2)
        assert resp.status_code == 200, server.output()[-3000:]


def test_a_step_compiling_a_missed_graph_is_slow_not_stuck():
    runtime = _runtime_with_a_step_started_at(100.0)
    runtime.serving.engine.compiling_inline = True
    assert not StepWatchdog(runtime, 5.0, exit_after_s=0.0).check(now=1000.0) and runtime.stuck is None
    runtime.serving.engine.compiling_inline = False
    assert StepWatchdog(runtime, 5.0, exit_after_s=0.0).check(now=1000.0)
