"""gunicorn configuration for ``aieng serve`` (the package's gunicorn.conf.py).

``aieng serve`` loads this module, then sets ``bind`` and ``workers`` from its settings. Each
value says why it is what it is.
"""

worker_class = "aieng.server.process.worker.AiengUvicornWorker"
# Weights are verified and loaded once in the master, then shared copy-on-write by the workers
# (see aieng.server.process.runtime: one torch thread and gc.freeze() before fork; nothing on CUDA).
preload_app = True
# A worker that stops heart-beating this long is killed and replaced (`aieng serve` sets it from
# AIENG_WORKER_TIMEOUT_S). The engine runs in its own thread, so the event loop keeps heart-beating
# even during long generations, and during the start too (start_heartbeat.py: a model that loads
# for longer than this is not a hung worker), up to AIENG_WORKER_START_TIMEOUT_S.
timeout = 120
# SIGTERM: in-flight requests have this long to finish before the worker is killed.
graceful_timeout = 30
# Idle keep-alive connections are closed after this many seconds.
keepalive = 5
# Recycle workers now and then (bounded memory growth); jitter keeps them from restarting together.
# `aieng serve` sets both from AIENG_MAX_REQUESTS; the worker retires without losing a request
# (aieng.server.process.worker.DrainingServer).
max_requests = 10000
max_requests_jitter = 1000
# Logs go to stderr like the rest of aieng.
accesslog = None
errorlog = "-"
loglevel = "info"
# gunicorn's control socket lives at one path per user: several servers on a host (tests,
# benchmarks, blue/green) would fight over it, and aieng does not use it.
control_socket_disable = True
# gunicorn's own log lines in aieng's JSON shape (one object per line on stderr).
logger_class = "aieng.observability.logs.GunicornJsonLogger"


def child_exit(server, worker):
    """A worker is gone (recycled, killed): drop its live gauges from the merged /metrics."""
    from aieng.observability.prom import mark_worker_dead

    mark_worker_dead(worker.pid)
