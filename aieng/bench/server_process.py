"""Start ``aieng serve`` as a child process on a free loopback port and wait until it is ready.

Used by integration tests, notebooks and benchmarks, so they all talk HTTP to the real server
exactly as a client would, instead of calling the app in-process.

The server must not outlive its owner: a notebook cell or a test that fails between ``start()``
and ``stop()`` would otherwise leave a server holding a port, cores and memory. Two guards:
``stop()`` is registered with ``atexit`` (a normal exit, a kernel shutdown), and on Linux the
child asks the kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``: a SIGKILLed owner,
a crashed kernel), which ``atexit`` cannot see. The server runs in its own session, so neither a
terminal's signals nor the owner's process group reach it any other way.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent():
    """A ``preexec_fn`` that has the child SIGTERMed when its parent dies, or None where unsupported.

    Linux only. The kernel sends the signal when the parent *thread* exits, so it is only used
    when starting from the main thread: a server started from a worker thread would otherwise be
    stopped when that thread ends, though its owner lives on (``atexit`` still covers it). The
    libc function is looked up here, in the parent: between fork and exec the child should do as
    little as possible.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    signum = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signum)

    return preexec


class ServerStartError(RuntimeError):
    """The server exited or never became ready; ``output`` holds what it printed."""

    def __init__(self, message: str, output: str, returncode: int | None):
        super().__init__(f"{message}\n--- server output ---\n{output[-4000:]}")
        self.output = output
        self.returncode = returncode


@dataclass
class ServerProcess:
    store: Path
    model: str = "demo"
    host: str = "127.0.0.1"
    port: int = 0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout: float = 300.0  # a cold torch.compile of every graph on 2 busy cores can take minutes
    log_path: Path | None = None  # server stdout+stderr go here (a temp file by default)
    process: subprocess.Popen | None = None
    name: str = "aieng serve"  # in start-up errors
    health_path: str = "/health/ready"  # answers 200 once the server can take requests

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "aieng",
            "--store",
            str(self.store),
            "serve",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--model",
            self.model,
            *self.extra_args,
        ]

    def start(self) -> ServerProcess:
        if not self.port:
            self.port = free_port(self.host)
        if self.log_path is None:
            import tempfile

            self.log_path = Path(tempfile.mkstemp(prefix="aieng-server-", suffix=".log")[1])
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **self.env}
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
        atexit.register(self._stop_at_exit)
        self._wait_ready()
        return self

    def wait_until_compiled(self, timeout: float = 900.0, log=None) -> float:
        """Wait while the server compiles in the background (ready, but serving eagerly: phase
        ``compile`` on /health/ready), so a benchmark measures the steady state, not the
        transition; returns the seconds waited."""
        start = time.monotonic()
        said = False
        while time.monotonic() - start < timeout:
            try:
                body = httpx.get(f"{self.base_url}{self.health_path}", timeout=2.0).json()
            except (httpx.HTTPError, ValueError):
                body = {}
            if body.get("phase") != "compile":
                break
            if log is not None and not said:
                log(f"waiting for the background compilation to finish ({body.get('detail', '')})")
                said = True
            time.sleep(0.5)
        return time.monotonic() - start

    def _stop_at_exit(self) -> None:
        self.stop()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()  # closes the log, drops the exit hook
                raise ServerStartError(
                    f"{self.name} exited with status {self.process.returncode} before it was "
                    f"ready (log: {self.log_path})",
                    self.output(),
                    self.process.returncode,
                )
            try:
                if httpx.get(f"{self.base_url}{self.health_path}", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(f"{self.name} was not ready within {self.ready_timeout}s", self.output(), None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.process is None:
            return None
        atexit.unregister(self._stop_at_exit)
        if self.process.poll() is not None:
            self._log.close()
            return self.process.returncode
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(10)
        finally:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
