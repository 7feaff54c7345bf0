"""A server started by ServerProcess dies with the Python process that started it.

Each test runs an owner: a small child Python that starts a ServerProcess and then dies in some
way without calling ``stop()``, as a notebook kernel or a test run does when a cell fails.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import psutil
import pytest

pytestmark = pytest.mark.server  # each test's child starts a real server

OWNER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from aieng.bench.server_process import ServerProcess

    server = ServerProcess(store=Path(sys.argv[1]), extra_args=["--workers", "1", "--no-compile"]).start()
    print(json.dumps({"pid": server.process.pid, "url": server.base_url}), flush=True)
    sys.stdin.readline()  # wait for the test: it kills us here, or closes stdin
    sys.exit(0)           # a normal exit without stop(): atexit must stop the server
""")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health/live", timeout=1.0)
        return True
    except httpx.HTTPError:
        return False


def _start_owner(store) -> tuple[subprocess.Popen, dict, list[int]]:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(store.root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    line = owner.stdout.readline()
    assert line, f"the owner exited with {owner.wait()} before its server was ready"
    server = json.loads(line)
    assert _alive(server["pid"]) and _answers(server["url"])
    workers = [child.pid for child in psutil.Process(server["pid"]).children(recursive=True)]
    return owner, server, workers


def _wait_gone(pids: list[int], url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids) and not _answers(url):
            return
        time.sleep(0.2)
    for pid in pids:  # do not leak them into the rest of the session
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    pytest.fail(f"processes {[p for p in pids if _alive(p)]} or {url} outlived their owner by {timeout}s")


def test_the_server_dies_when_its_owner_is_killed(demo_store):
    owner, server, workers = _start_owner(demo_store)
    owner.kill()  # SIGKILL: no atexit, no finally; only the parent-death signal can stop the server
    owner.wait()
    _wait_gone([server["pid"], *workers], server["url"])


def test_the_server_is_stopped_before_its_owner_exits(demo_store):
    owner, server, workers = _start_owner(demo_store)
    owner.stdin.close()
    assert owner.wait(60) == 0
    # atexit ran stop(), which waits for the server: it is gone the moment its owner is, not
    # merely signalled (the parent-death signal alone would leave it draining for a while)
    assert not _alive(server["pid"]) and not _answers(server["url"])
    _wait_gone(workers, server["url"])
