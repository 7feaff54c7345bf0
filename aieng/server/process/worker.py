"""The gunicorn worker: uvicorn, plus a graceful drain on SIGTERM.

On SIGTERM the worker first turns readiness to 503 but goes on serving, new requests included
(a lame duck), for ``drain_delay_s``: load balancers polling ``/health/ready`` need a few checks to
take it out, and what they send meanwhile must not fail. Then it stops admitting (503
``not_ready``, retryable, with ``Connection: close``), closes the listener and waits for the
responses in flight (up to gunicorn's ``graceful_timeout``).
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

from aieng.server.process.gpu_worker import pin_worker, wait_for_gpu_release
from aieng.server.process.http_protocol import GuardedHttpToolsProtocol
from aieng.server.process.start_heartbeat import beat_interval, beat_while_starting
from aieng.settings import Settings

log = logging.getLogger("aieng.server")

IDLE_CLOSE_S = 1.0  # a retiring worker closes connections idle this long instead of waiting for the keep-alive timer


class DrainingServer(Server):
    """uvicorn's server with aieng's two ways out: the SIGTERM drain, and a lossless recycle.

    Recycling (gunicorn's ``max_requests``, ``AIENG_MAX_REQUESTS``; or resident memory past
    ``AIENG_MAX_WORKER_MEMORY_MB``): uvicorn's own way closes every idle keep-alive connection
    the moment the count is reached, and a client that was just sending its next request on one
    of them loses it (a connection reset, never seen by the server). Here the worker *retires*
    instead: it stops accepting connections (the other workers take the new ones), answers every
    further request on its open connections with ``Connection: close`` (so each client learns,
    at its next request, to go elsewhere), closes connections idle for ``IDLE_CLOSE_S`` (a
    client that has not used its connection for a second is not about to: the race uvicorn
    loses is with a client between two back-to-back requests), and exits once no connection is
    left (or after ``graceful_timeout``), when gunicorn starts its replacement. SIGTERM (a shutdown,
    or gunicorn's SIGHUP reload) ends the
    same way after the drain delay, except that the draining runtime answers those further
    requests with 503 ``not_ready`` (and ``Connection: close``) instead of serving them.
    """

    def __init__(
        self,
        config,
        runtime,
        *,
        retire_after: int | None = None,
        retire_within_s: float = 30.0,
        max_memory_bytes: int = 0,
    ):
        super().__init__(config)
        self.runtime = runtime
        self.retire_after = retire_after
        self.retire_within_s = retire_within_s
        self.max_memory_bytes = max_memory_bytes
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
        if self.retiring_since is None and (reason := self._retire_reason(counter)):
            self._retire(reason)
        exit_now = await super().on_tick(counter)  # refreshes the default headers once a second
        if self.retiring_since is None:
            return exit_now
        if not any(name == b"connection" for name, _ in state.default_headers):
            state.default_headers = [*state.default_headers, (b"connection", b"close")]
        now = asyncio.get_running_loop().time()
        for connection in list(state.connections):  # idle a while: its client is not about to send on it
            idle_since = getattr(connection, "idle_since", None)
            if idle_since is not None and now - idle_since >= IDLE_CLOSE_S:
                connection.shutdown()
        done = not state.connections or time.monotonic() - self.retiring_since > self.retire_within_s
        if done and not exit_now:
            log.info(
                "worker retired: %s",
                "every connection closed"
                if not state.connections
                else f"{len(state.connections)} connection(s) still open after {self.retire_within_s:g} s",
                extra={"event": "worker_retired", "open_connections": len(state.connections)},
            )
        return exit_now or done

    def _retire_reason(self, counter: int) -> str | None:
        served = self.server_state.total_requests
        if self.retire_after and served >= self.retire_after:
            return f"served {served} requests (AIENG_MAX_REQUESTS)"
        if self.max_memory_bytes and counter % 10 == 0:  # once a second
            rss = resident_bytes()
            if rss > self.max_memory_bytes:
                return f"resident memory {rss / 2**20:.0f} MiB is over AIENG_MAX_WORKER_MEMORY_MB"
        return None

    def _retire(self, reason: str) -> None:
        if self.retiring_since is not None:
            return
        self.retiring_since = time.monotonic()
        for server in self.servers:
            server.close()  # no new connections: the other workers accept them
        log.info(
            "worker retiring (%s): no new connections, Connection: close on the next response of each of its "
            "%d open connection(s)",
            reason,
            len(self.server_state.connections),
            extra={
                "event": "worker_retiring",
                "reason": reason,
                "requests": self.server_state.total_requests,
                "open_connections": len(self.server_state.connections),
            },
        )

    def handle_exit(self, sig, frame):
        runtime = self.runtime
        if runtime is None or runtime.draining or self._loop is None:
            return super().handle_exit(sig, frame)  # a second signal: stop now
        runtime.drain()  # readiness 503 at once; requests still admitted for the drain delay
        delay = runtime.config.drain_delay_s
        self._loop.call_soon_threadsafe(self._loop.call_later, delay, self._close_after_drain_delay, sig)

    def _close_after_drain_delay(self, sig) -> None:
        self.runtime.close_admission()
        self._retire(f"signal {sig}")


def resident_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


class AiengUvicornWorker(UvicornWorker):
    async def _beat_while_starting(self, server, runtime) -> str:
        """gunicorn's heartbeat while the app's startup loads the model (start_heartbeat.py)."""
        settings = runtime.settings if runtime is not None else Settings()
        limit_s = settings.worker_start_timeout_s

        def on_limit() -> None:
            log.error(
                "worker start still running after AIENG_WORKER_START_TIMEOUT_S=%gs: heart-beating stops, "
                "gunicorn kills it after AIENG_WORKER_TIMEOUT_S=%ds; the log above says which phase it was in",
                limit_s,
                self.cfg.timeout,
                extra={"event": "worker_start_timeout"},
            )

        return await beat_while_starting(
            self.notify,
            lambda: server.started or server.should_exit,
            interval_s=beat_interval(self.cfg.timeout),
            limit_s=limit_s,
            on_limit=on_limit,
        )

    # http_protocol.py: uvicorn's httptools protocol plus a header deadline and an enveloped 503
    CONFIG_KWARGS = {"loop": "uvloop", "http": GuardedHttpToolsProtocol, "lifespan": "on"}

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        runtime = getattr(getattr(self.wsgi, "state", None), "runtime", None)
        if runtime is not None:
            device = pin_worker(runtime, getattr(self, "gpu_slot", None))  # on a GPU host: pre_fork's slot
            await wait_for_gpu_release(
                getattr(self, "gpu_held_by", []),
                device,
                notify=self.notify,
                limit_s=float(self.cfg.graceful_timeout) + runtime.settings.drain_delay_s + 10,
            )
            # a wedged engine (step_watchdog.py) ends this worker the usual way: drain, exit
            runtime.on_stuck = lambda: os.kill(os.getpid(), signal.SIGTERM)
            settings = runtime.settings
            self.config.header_timeout_s = settings.header_timeout_s
            self.config.limit_concurrency = settings.max_connections or None
        memory_mb = runtime.settings.max_worker_memory_mb if runtime is not None else 0
        server = DrainingServer(
            self.config,
            runtime,
            retire_after=self.max_requests or None,
            retire_within_s=float(self.cfg.graceful_timeout),
            max_memory_bytes=memory_mb * 2**20,
        )
        self._install_sigquit_handler()
        heartbeat = asyncio.ensure_future(self._beat_while_starting(server, runtime))
        try:
            await server.serve(sockets=self.sockets)
        finally:
            heartbeat.cancel()
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
