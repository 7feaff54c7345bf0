"""The gunicorn worker: uvicorn, plus a graceful drain on SIGTERM.

On SIGTERM the worker first turns readiness to 503 and stops admitting new requests, keeps
serving what is in flight, and only after ``drain_delay_s`` lets uvicorn close the listener and
wait for the remaining responses (up to gunicorn's ``graceful_timeout``). The delay gives load
balancers polling ``/health/ready`` time to stop sending traffic.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from aieng.server.process.http_protocol import GuardedHttpToolsProtocol

log = logging.getLogger("aieng.server")


class DrainingServer(Server):
    """uvicorn's server with aieng's two ways out: the SIGTERM drain, and a lossless recycle.

    Recycling (gunicorn's ``max_requests``, ``AIENG_MAX_REQUESTS``): uvicorn's own way closes
    every idle keep-alive connection the moment the count is reached, and a client that was
    just sending its next request on one of them loses it (a connection reset, never seen by
    the server). Here the worker *retires* instead: it stops accepting connections (the other
    workers take the new ones), answers every further request on its open connections with
    ``Connection: close`` (so each client learns, at its next request, to go elsewhere), lets
    idle connections run out on the keep-alive timer as always, and exits once no connection
    is left (or after ``graceful_timeout``), when gunicorn starts its replacement.
    """

    def __init__(self, config, runtime, *, retire_after: int | None = None, retire_within_s: float = 30.0):
        super().__init__(config)
        self.runtime = runtime
        self.retire_after = retire_after
        self.retire_within_s = retire_within_s
        self.retiring_since: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def limit_max_requests(self) -> int | None:  # uvicorn's own check would close idle connections at once
        return None

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    async def on_tick(self, counter: int) -> bool:
        state = self.server_state
        if self.retiring_since is None and self.retire_after and state.total_requests >= self.retire_after:
            self._retire(state.total_requests)
        exit_now = await super().on_tick(counter)  # refreshes the default headers once a second
        if self.retiring_since is None:
            return exit_now
        if not any(name == b"connection" for name, _ in state.default_headers):
            state.default_headers = [*state.default_headers, (b"connection", b"close")]
        done = not state.connections or time.monotonic() - self.retiring_since > self.retire_within_s
        if done and not exit_now:
            log.info("worker retired: %s", "every connection closed" if not state.connections else
                     f"{len(state.connections)} connection(s) still open after {self.retire_within_s:g} s",
                     extra={"event": "worker_retired", "open_connections": len(state.connections)})
        return exit_now or done

    def _retire(self, served: int) -> None:
        self.retiring_since = time.monotonic()
        for server in self.servers:
            server.close()  # no new connections: the other workers accept them
        log.info("worker retiring after %d requests: no new connections, Connection: close on the next response of "
                 "each of its %d open connection(s)", served, len(self.server_state.connections),
                 extra={"event": "worker_retiring", "requests": served,
                        "open_connections": len(self.server_state.connections)})

    def handle_exit(self, sig, frame):
        runtime = self.runtime
        if runtime is None or runtime.draining or self._loop is None:
            return super().handle_exit(sig, frame)  # a second signal: stop now
        runtime.drain()
        delay = runtime.config.drain_delay_s
        self._loop.call_soon_threadsafe(self._loop.call_later, delay, Server.handle_exit, self, sig, frame)


class AiengUvicornWorker(UvicornWorker):
    # http_protocol.py: uvicorn's httptools protocol plus a header deadline and an enveloped 503
    CONFIG_KWARGS = {"loop": "uvloop", "http": GuardedHttpToolsProtocol, "lifespan": "on"}

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        runtime = getattr(getattr(self.wsgi, "state", None), "runtime", None)
        if runtime is not None:  # a wedged engine (step_watchdog.py) ends this worker the usual way: drain, exit
            runtime.on_stuck = lambda: os.kill(os.getpid(), signal.SIGTERM)
            settings = runtime.settings
            self.config.header_timeout_s = settings.header_timeout_s
            self.config.limit_concurrency = settings.max_connections or None
        server = DrainingServer(self.config, runtime, retire_after=self.max_requests or None,
                                retire_within_s=float(self.cfg.graceful_timeout))
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
