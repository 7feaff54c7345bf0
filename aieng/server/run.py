"""``aieng serve``: verify and load in the master, then run gunicorn with uvicorn workers.

A version that fails verification never answers a request: ``prepare()`` raises before gunicorn
starts, the CLI prints the reason on one line and exits 1, which is what a supervisor needs.
"""

from __future__ import annotations

import logging
import os

from dataclasses import replace
import psutil
from gunicorn.app.base import BaseApplication

from aieng.engine import EngineConfig
from aieng.scheduler import SchedulerConfig
from aieng.server.app import create_app
from aieng.server.runtime import Runtime, RuntimeConfig, _wants_cuda
from aieng.server.workers import WorkerPlan, plan_workers
from aieng.errors import ConfigError
from aieng.settings import Settings

log = logging.getLogger("aieng.server")
PER_WORKER_OVERHEAD = 384 * 2**20  # interpreter, tokenizer, HTTP stack, allocator slack


class GunicornApplication(BaseApplication):
    def __init__(self, app, options: dict):
        self.application = app
        self.options = options
        super().__init__()

    def load_config(self):
        from aieng.server import gunicorn_conf

        conf = {k: v for k, v in vars(gunicorn_conf).items() if k in self.cfg.settings}
        for key, value in {**conf, **self.options}.items():
            self.cfg.set(key, value)

    def load(self):
        return self.application


def worker_plan(settings: Settings, runtime: Runtime) -> WorkerPlan:
    """``--workers auto``: see aieng.server.workers.plan_workers for the formula."""
    import torch

    manifest = runtime.loaded.manifest if runtime.loaded else None
    params = manifest.num_parameters if manifest else 0
    weight_bytes = params * (4 if not _wants_cuda(settings.device) else 2)
    config = runtime.loaded.model.config if runtime.loaded else None
    kv_bytes = 0
    if config is not None:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        kv_bytes = 2 * config.num_hidden_layers * kv_heads * head_dim * runtime.loaded.context_length \
            * settings.max_batch_size * 4
    gpus = torch.cuda.device_count() if _wants_cuda(settings.device) else 0
    return plan_workers(cores=os.cpu_count() or 1, available_bytes=psutil.virtual_memory().available,
                        weight_bytes=weight_bytes, per_worker_bytes=PER_WORKER_OVERHEAD + kv_bytes,
                        device="cuda" if gpus else "cpu", gpus=gpus, requested=settings.workers)


def build_runtime(settings: Settings) -> Runtime:
    engine = EngineConfig(max_batch_size=settings.max_batch_size, compile=settings.compile,
                          quantize_int8=settings.int8)
    scheduler = SchedulerConfig(max_batch_size=settings.max_batch_size, max_batch_tokens=settings.max_batch_tokens,
                                max_queue=settings.max_queue, max_queue_delay_ms=settings.max_queue_delay_ms,
                                default_timeout_s=settings.request_timeout_s)
    return Runtime(RuntimeConfig(settings=settings, engine=engine, scheduler=scheduler,
                                 drain_delay_s=settings.drain_delay_s))


def serve(settings: Settings) -> None:
    runtime = build_runtime(settings)
    runtime.prepare()  # raises AiengError (verification, memory budget, remote code) before any fork
    plan = worker_plan(settings, runtime)
    if settings.torch_threads < 0:
        raise ConfigError(f"torch threads must be >= 0 (0 = cores // workers), got {settings.torch_threads}")
    if settings.torch_threads:
        plan = replace(plan, torch_threads=settings.torch_threads,
                       reason=plan.reason + f"; torch threads set to {settings.torch_threads}")
    runtime.config.torch_threads = plan.torch_threads
    warmed = runtime.warm_before_fork()
    if warmed is not None:
        log.info("engine warmed up before fork in %.1fs%s; workers share it", warmed,
                 " (torch.compile included)" if runtime.engine.compiled else "")
    log.info("serving %s@%s on http://%s:%d with %d worker(s) x %d torch thread(s): %s", runtime.model_name,
             runtime.model_version, settings.host, settings.port, plan.workers, plan.torch_threads, plan.reason)
    app = create_app(runtime, max_body_bytes=settings.max_body_bytes)
    options = {"bind": f"{settings.host}:{settings.port}", "workers": plan.workers,
               "graceful_timeout": settings.graceful_timeout_s, "loglevel": settings.log_level}
    GunicornApplication(app, options).run()
