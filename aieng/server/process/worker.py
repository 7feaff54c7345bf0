"""The gunicorn worker: uvicorn, plus a graceful drain on SIGTERM.

On SIGTERM the worker first turns readiness to 503 and stops admitting new requests, keeps
serving what is in flight, and only after ``drain_delay_s`` lets uvicorn close the listener and
wait for the remaining responses (up to gunicorn's ``graceful_timeout``). The delay gives load
balancers polling ``/health/ready`` time to stop sending traffic.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from aieng.server.process.http_protocol import GuardedHttpToolsProtocol


class DrainingServer(Server):
    def __init__(self, config, runtime):
        super().__init__(config)
        self.runtime = runtime
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None):
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

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
        server = DrainingServer(self.config, runtime)
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
