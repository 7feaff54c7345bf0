"""Start ``aieng serve`` as a child process on a free loopback port and wait until it is ready.

Used by integration tests, notebooks and benchmarks, so they all talk HTTP to the real server
exactly as a client would, instead of calling the app in-process.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "aieng", "--store", str(self.store), "serve", "--host", self.host,
                "--port", str(self.port), "--model", self.model, *self.extra_args]

    def start(self) -> "ServerProcess":
        if not self.port:
            self.port = free_port(self.host)
        if self.log_path is None:
            import tempfile

            self.log_path = Path(tempfile.mkstemp(prefix="aieng-server-", suffix=".log")[1])
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **self.env}
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        self._wait_ready()
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"aieng serve exited with status {self.process.returncode} before it was ready",
                                       self.output(), self.process.returncode)
            try:
                if httpx.get(f"{self.base_url}/health/ready", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerStartError(f"aieng serve was not ready within {self.ready_timeout}s", self.output(), None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.process is None:
            return None
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

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
