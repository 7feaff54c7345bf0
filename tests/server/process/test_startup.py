"""Start-up phases: logged as they start and end, a heartbeat while one runs, shown by readiness."""

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest

from aieng.server.process.runtime import Runtime, RuntimeConfig
from aieng.server.process.startup import PhasedStore, StartupProgress
from aieng.settings import Settings

from ...polling import poll


def events(caplog, name=None):
    lines = [r for r in caplog.records if r.name == "aieng.server.startup"]
    return [r for r in lines if name is None or r.event == name]


def test_each_phase_start_and_end_is_one_line_with_its_seconds(caplog):
    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    now = [100.0]
    progress = StartupProgress(clock=lambda: now[0], heartbeat_s=3600)
    progress.begin("verify", "sha256 of 4 files")
    now[0] += 2.0
    progress.begin("load", "weights")
    now[0] += 3.0
    progress.detail("shard 1/1")
    progress.finish()
    assert [(r.event, r.phase) for r in events(caplog)] == [
        ("startup_phase_start", "verify"),
        ("startup_phase_end", "verify"),
        ("startup_phase_start", "load"),
        ("startup_progress", "load"),
        ("startup_phase_end", "load"),
        ("startup_ready", "ready"),
    ]
    ends = {r.phase: r.seconds for r in events(caplog, "startup_phase_end")}
    assert ends == {"verify": 2.0, "load": 3.0}
    ready = events(caplog, "startup_ready")[0]
    assert ready.seconds == 5.0 and ready.phases == {"verify": 2.0, "load": 3.0}


def wait_until(check, timeout: float = 10.0):
    assert poll(check, timeout, poll_s=0.005), "timed out"


def test_the_heartbeat_says_what_is_still_running_and_stops_when_ready(caplog):
    """The heartbeat reads the progress's clock, which the test moves: a beat is due the moment
    the clock passes ``heartbeat_s`` since the last line, and the test waits for that line."""
    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    now = [100.0]
    progress = StartupProgress(clock=lambda: now[0], heartbeat_s=0.05)  # the thread looks every 10 ms
    beats = lambda: events(caplog, "startup_heartbeat")  # noqa: E731
    progress.begin("warmup", "torch.compile")
    progress.detail("decode batch 32 (5/6)")
    assert beats() == []  # the clock has not moved: nothing is due
    for n in (1, 2):
        now[0] += 1.0
        wait_until(lambda n=n: len(beats()) == n)
    assert beats()[-1].getMessage() == "still warmup decode batch 32 (5/6) after 2 s"
    assert beats()[-1].phase_s == 2.0
    thread = progress._thread
    progress.finish()
    wait_until(lambda: not thread.is_alive())  # ready: the heartbeat thread ends
    now[0] += 60.0
    assert len(beats()) == 2 and progress._thread is None
    progress.begin("compile", "in the background")  # a phase after ready: the heartbeat comes back
    now[0] += 1.0
    wait_until(lambda: len(beats()) == 3)
    assert beats()[-1].phase == "compile"
    progress.stop_heartbeat()


def test_phases_can_be_set_from_any_thread():
    progress = StartupProgress(heartbeat_s=3600)
    progress.begin("warmup")

    def report(worker):
        for i in range(200):
            progress.detail(f"{worker}:{i}")
            snap = progress.snapshot()
            assert snap["phase"] == "warmup" and ":" in snap["detail"]

    threads = [threading.Thread(target=report, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert progress.snapshot()["detail"].endswith(":199")
    progress.stop_heartbeat()


class StubEngine:
    """The engine's side of the contract: ``warmup(progress=callback)`` calls back before each shape."""

    compiled = False
    compile_status = "eager"
    config = SimpleNamespace(compile=False)

    def __init__(self, fail=False):
        self.fail = fail
        self.seen = []

    def warmup(self, *, progress):
        for i, shape in enumerate(["prefill batch 1 × 8 tokens", "decode batch 1"], start=1):
            progress(f"{shape} ({i}/2)")
            self.seen.append(shape)
        if self.fail:
            raise RuntimeError("boom")
        return 0.01


class StubLoop:
    def __init__(self):
        self.scheduler = self

    def start(self):
        pass

    def drain(self):
        pass


def runtime_with(engine):
    runtime = Runtime(RuntimeConfig(settings=Settings()))
    runtime.progress.heartbeat_s = 3600
    runtime.engine, runtime.engine_loop, runtime.model_version = engine, StubLoop(), "1"
    return runtime


def test_ready_reports_the_phase_while_starting_and_keeps_the_ready_and_drain_bodies(caplog):
    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    runtime = runtime_with(StubEngine())
    status, body = runtime.readiness()
    assert status == 503 and body["error"]["code"] == "not_ready" and body["status"] == "starting"
    runtime.progress.begin("warmup", "eager")
    runtime.progress.detail("prefill batch 8 × 32 tokens (3/6)")
    status, body = runtime.readiness()
    assert (status, body["phase"], body["detail"]) == (503, "warmup", "prefill batch 8 × 32 tokens (3/6)")
    assert body["elapsed_s"] >= 0 and body["startup_s"] >= body["elapsed_s"]
    runtime._warm_then_serve()
    assert runtime.readiness() == (200, {"status": "ready", "model": "demo", "version": "1"})
    assert [r.detail for r in events(caplog, "startup_progress")][-3:-1] == [
        "prefill batch 1 × 8 tokens (1/2)",
        "decode batch 1 (2/2)",
    ]
    runtime.drain()
    status, body = runtime.readiness()
    assert status == 503 and body["status"] == "draining" and body["error"]["code"] == "not_ready"


def test_a_compile_the_engine_finishes_in_the_background_is_a_phase_of_a_ready_server(caplog):
    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    engine = StubEngine()
    engine.compile_status = "compiling"
    runtime = runtime_with(engine)
    runtime._warm_then_serve()
    status, body = runtime.readiness()
    assert (status, body["status"], body["phase"]) == (200, "ready", "compile")
    engine.compile_status = "compiled"
    deadline = time.monotonic() + 5
    while runtime.progress.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runtime.readiness() == (200, {"status": "ready", "model": "demo", "version": "1"})
    assert events(caplog, "startup_ready")[-1].compile_status == "compiled"


def test_a_failed_warmup_is_logged_and_shown_not_left_as_starting_forever(caplog):
    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    runtime = runtime_with(StubEngine(fail=True))
    with pytest.raises(RuntimeError):
        runtime._warm_then_serve()
    failed = events(caplog, "startup_failed")[0]
    assert failed.levelno == logging.ERROR and failed.phase == "warmup" and "boom" in failed.getMessage()
    status, body = runtime.readiness()
    assert status == 503 and body["status"] == "failed" and body["phase"] == "failed"
    assert "RuntimeError" in body["detail"] and "boom" not in body["detail"]  # the log has it, not the client


def test_verify_and_load_are_two_phases_of_one_load_without_hashing_twice(tiny_demo_dir, tmp_path, caplog, monkeypatch):
    from aieng.loading.loader import load_version
    from aieng.store import ModelRef, ModelStore
    from aieng.store import store as store_module

    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    ModelStore(tmp_path).register(tiny_demo_dir, "tiny", "1")
    hashed = []
    real = store_module.compare_hashes
    monkeypatch.setattr(store_module, "compare_hashes", lambda *a: hashed.append(1) or real(*a))
    progress = StartupProgress(heartbeat_s=3600)
    load_version(PhasedStore(tmp_path, progress, load_next=True), ModelRef("tiny", "1"))
    assert [r.phase for r in events(caplog, "startup_phase_start")] == ["verify", "load"]
    assert len(hashed) == 1 and progress.phase == "load"
    assert "tiny@1" in events(caplog, "startup_phase_start")[0].detail


def test_a_worker_reuses_the_masters_verification_unless_a_file_changed_since(
    tiny_demo_dir, tmp_path, monkeypatch, caplog
):
    """On CUDA the master verifies and every worker loads: a worker forked with the master's
    record hashes nothing again, unless a file was written after the master hashed it."""
    from aieng.errors import VerificationError
    from aieng.loading.loader import load_version
    from aieng.store import ModelRef, ModelStore
    from aieng.store import store as store_module

    caplog.set_level(logging.INFO, logger="aieng.server.startup")
    ModelStore(tmp_path).register(tiny_demo_dir, "tiny", "1")
    ModelStore(tmp_path).promote("tiny", "1")
    hashed = []
    real = store_module.compare_hashes
    monkeypatch.setattr(store_module, "compare_hashes", lambda *a: hashed.append(1) or real(*a))
    runtime = Runtime(RuntimeConfig(settings=Settings(store=tmp_path, model="tiny", device="cuda")))
    runtime.progress = StartupProgress(heartbeat_s=3600)
    runtime.prepare()  # the master on a CUDA host: verify only
    assert runtime.loaded is None and len(hashed) == 1 and list(runtime.verified) == ["tiny@1"]

    worker = PhasedStore(tmp_path, StartupProgress(heartbeat_s=3600), load_next=True, verified=runtime.verified)
    load_version(worker, ModelRef("tiny", "1"))
    assert len(hashed) == 1  # the worker's load hashed nothing again
    verify = [r.detail for r in events(caplog, "startup_phase_start") if r.phase == "verify"]
    assert verify[-1].startswith("tiny@1: ") and verify[-1].endswith(
        "files unchanged since they were hashed before fork"
    )

    weights = next((tmp_path / "tiny" / "versions" / "1").glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one byte different: a write after the master's check
    weights.write_bytes(bytes(data))
    with pytest.raises(VerificationError):
        load_version(worker, ModelRef("tiny", "1"))
    assert len(hashed) == 2  # hashed again, and refused


_PREPARE_AND_COUNT_THREADS = textwrap.dedent(
    """
    import os, sys, threading
    import torch
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    def native_threads():
        return {int(t) for t in os.listdir("/proc/self/task")} - {t.native_id for t in threading.enumerate()}

    torch.set_num_threads(2)  # as a worker of two threads: the master's work could start a pool
    before = native_threads()
    runtime = Runtime(RuntimeConfig(settings=Settings(store=sys.argv[1], model="demo")))
    runtime.prepare()
    k = runtime.loaded.model.model.layers[0].self_attn.k_proj.weight
    print(len(native_threads() - before), k.storage_offset() > 0, torch.get_num_threads())
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_the_master_fuses_the_layers_without_starting_an_openmp_pool(demo_store):
    """A pool made in the master is inherited by every worker as bookkeeping for threads that fork
    did not copy, and the workers' parallel kernels then crawl; the fused layers (the k rows start
    after q's in one storage) must be made on the master's one thread."""
    out = subprocess.run(
        [sys.executable, "-c", _PREPARE_AND_COUNT_THREADS, str(demo_store.root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == ["0", "True", "2"]  # no pool thread; fused; the thread count given back
