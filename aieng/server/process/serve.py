"""``aieng serve``: verify and load in the master, then run gunicorn with uvicorn workers.

A version that fails verification never answers a request: ``prepare()`` raises before gunicorn
starts, the CLI prints the reason on one line and exits 1, which is what a supervisor needs.

The master's start-up phases (``verify``, ``load``, ``warmup`` when it warms before fork, then
``workers``) are logged by the runtime's ``StartupProgress``; its heartbeat thread is stopped
before gunicorn forks (no thread may hold a lock across fork), and each worker's phases go on in
the worker.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from gunicorn.app.base import BaseApplication

from aieng.engine.native.onednn_caches import bound_onednn_caches
from aieng.host.gpus import default_alloc_conf, fork_safe_cuda_checks
from aieng.observability.logs import log_event
from aieng.server.http.app import create_app
from aieng.server.process import gpu_worker
from aieng.server.process.compile_cache import use_compile_cache
from aieng.server.process.runtime import Runtime, RuntimeConfig
from aieng.server.process.startup import StartupProgress
from aieng.server.process.worker_plan import plan_for_model
from aieng.settings import Settings

log = logging.getLogger("aieng.server")


class GunicornApplication(BaseApplication):
    def __init__(self, app, options: dict):
        self.application = app
        self.options = options
        super().__init__()

    def load_config(self):
        from aieng.server.process import gunicorn_conf

        conf = {k: v for k, v in vars(gunicorn_conf).items() if k in self.cfg.settings}
        for key, value in {**conf, **self.options}.items():
            self.cfg.set(key, value)

    def load(self):
        return self.application


def serve(settings: Settings, progress: StartupProgress | None = None) -> None:
    """``progress``: the CLI's, already running since before the heavy imports."""
    fork_safe_cuda_checks()  # before anything asks torch about CUDA in this (the master) process
    # before the master's or a worker's first oneDNN multiply; the workers inherit the environment
    log_event(log, "onednn_caches", **bound_onednn_caches())
    if settings.compile:  # before anything compiles; workers and compile subprocesses inherit it
        log_event(log, "compile_cache", **use_compile_cache(settings.compile_cache_dir))
    default_alloc_conf()  # expandable segments, unless set: before any process initialises CUDA
    runtime = Runtime(RuntimeConfig.from_settings(settings), progress=progress)
    runtime.prepare()  # raises AiengError (verification, memory budget, remote code) before any fork
    plan = plan_for_model(settings, runtime.loaded)
    runtime.config.torch_threads = plan.torch_threads
    if plan.split is not None:  # one worker over several GPUs
        runtime.gpu_split = plan.split
        runtime.config.engine = replace(runtime.config.engine, native=False)  # the native forward is one-device
    log_event(log, "worker_plan", workers=plan.workers, torch_threads=plan.torch_threads, reason=plan.reason)
    runtime.worker_plan = plan  # each process logs it with its engine's choices (serving_plan)
    runtime.warm_before_fork()
    runtime.progress.begin("workers", f"{plan.workers} worker(s) x {plan.torch_threads} torch thread(s)")
    log.info(
        "serving %s@%s on http://%s:%d with %d worker(s) x %d torch thread(s): %s",
        runtime.model_name,
        runtime.model_version,
        settings.host,
        settings.port,
        plan.workers,
        plan.torch_threads,
        plan.reason,
    )
    runtime.progress.stop_heartbeat()  # no thread may hold a lock across fork; each worker starts its own
    app = create_app(runtime, max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s)
    options = {
        "bind": f"{settings.host}:{settings.port}",
        "workers": plan.workers,
        "graceful_timeout": settings.graceful_timeout_s,
        "timeout": settings.worker_timeout_s,
        "loglevel": settings.log_level,
        "max_requests": settings.max_requests,
        "max_requests_jitter": settings.max_requests // 10,
    }
    if plan.gpus and runtime.gpu_split is None:  # worker i on cuda:i; a replacement takes its GPU back
        options["pre_fork"] = gpu_worker.pre_fork_for(plan.gpus)
    GunicornApplication(app, options).run()
