"""The serving runtime of one process: model, engine, engine thread, readiness.

Split in two phases because of the process model:

- ``prepare()`` runs in the gunicorn master before fork (``preload``): verify and load the
  weights with one torch thread (no OpenMP pool exists to be broken by fork), then
  ``gc.freeze()`` so the collector never writes to — and so un-shares — those pages. On CUDA
  nothing is loaded here: a CUDA context must never be created before fork.
- ``start()`` runs in each worker (the app's lifespan): torch threads for this worker, the
  engine, its thread, and warm-up in the background; ``/health/ready`` turns 200 when warm.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from dataclasses import dataclass

import torch

from aieng.observability import metrics
from aieng.engine import Engine, EngineConfig
from aieng.errors import NotReadyError, request_error_codes
from aieng.loading.device import wants_cuda
from aieng.loading.loader import LoadConfig, LoadedModel, load_version
from aieng.observability.logs import set_service
from aieng.scheduler import EngineLoop, SchedulerConfig
from aieng.observability.observer import MetricsObserver
from aieng.server.http.bridge import Bridge
from aieng.server.http.inputs import RequestBuilder
from aieng.settings import Settings
from aieng.store import ModelStore, parse_ref

log = logging.getLogger("aieng.server")


@dataclass
class RuntimeConfig:
    settings: Settings
    engine: EngineConfig = EngineConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    torch_threads: int | None = None  # per worker; None = leave torch's default
    drain_delay_s: float = 1.0  # after SIGTERM: report 503 this long before closing the listener

    @classmethod
    def from_settings(cls, settings: Settings) -> "RuntimeConfig":
        """The one place where ``Settings`` (environment and flags) become component configs."""
        engine = EngineConfig(compile=settings.compile, quantize_int8=settings.int8)
        scheduler = SchedulerConfig(max_batch_size=settings.max_batch_size, max_batch_tokens=settings.max_batch_tokens,
                                    max_queue=settings.max_queue, max_queue_delay_ms=settings.max_queue_delay_ms,
                                    default_timeout_s=settings.request_timeout_s)
        return cls(settings=settings, engine=engine, scheduler=scheduler, drain_delay_s=settings.drain_delay_s)


class Runtime:
    def __init__(self, config: RuntimeConfig):
        self.config = config
        self.settings = config.settings
        self.ref = parse_ref(self.settings.model)
        self.loaded: LoadedModel | None = None
        self.engine: Engine | None = None
        self.engine_loop: EngineLoop | None = None  # the engine thread; requests go to its scheduler
        self.bridge: Bridge | None = None
        self.inputs: RequestBuilder | None = None
        self.ready = False
        self.draining = False
        self.started_at = time.time()
        self.warmup_seconds: float | None = None
        self.model_name = self.ref.name
        self.model_version: str | None = None

    # -- master --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Verify (always) and, on CPU, load before fork. Raises AiengError when it must not serve."""
        store = ModelStore(self.settings.store)
        version = store.resolve(self.ref)
        self.model_version = version
        load_config = LoadConfig.from_settings(self.settings)
        if wants_cuda(load_config.device):
            store.verify_or_raise(type(self.ref)(self.ref.name, version))  # load happens in the worker
            return
        with _one_torch_thread():
            self.loaded = load_version(store, type(self.ref)(self.ref.name, version), load_config)
        gc.collect()
        gc.freeze()

    def warm_before_fork(self) -> float | None:
        """CPU workers with one torch thread: build the engine and warm it up (torch.compile
        included) here in the master, so every worker inherits the compiled graphs copy-on-write.

        Why: compiled graphs and the compiler's imports are a large private share of a worker's memory
        (the PSS figures of `aieng bench serve` show it); compiled once
        before fork they are shared pages, not private to each worker, and a multi-worker start
        compiles once instead of once per worker. Only at one thread per worker, because inductor
        bakes the thread count into the kernels it generates, and an OpenMP pool must not exist
        before fork (at one thread none is created). Never on CUDA: nothing may touch the device
        before fork. Returns the warm-up seconds, or None when it did not apply.
        """
        if self.loaded is None or self.config.torch_threads != 1:
            return None
        with _one_torch_thread():
            self.engine = self._build_engine()
            seconds = self.engine.warmup()
        if self.engine.compiled:
            from torch._inductor.async_compile import shutdown_compile_workers

            shutdown_compile_workers()  # the compile pool's processes must not outlive warm-up in the master
        gc.collect()
        gc.freeze()
        return seconds

    # -- worker --------------------------------------------------------------------------------
    def start(self, *, background_warmup: bool = True) -> None:
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        if self.loaded is None:
            store = ModelStore(self.settings.store)
            self.loaded = load_version(store, self.ref, LoadConfig.from_settings(self.settings))
        self.model_version = self.loaded.version
        if self.engine is None:  # not built before fork (CUDA, several torch threads, or in-process use)
            self.engine = self._build_engine()
        observers = [MetricsObserver()] if self.settings.metrics else []
        self.engine_loop = EngineLoop(self.engine, self.config.scheduler, observers=observers)
        self.bridge = Bridge(self.engine_loop.scheduler, metrics_enabled=self.settings.metrics)
        self.inputs = RequestBuilder(self.engine)
        set_service(self.model_name, self.model_version)
        metrics.QUEUE_CAPACITY.set(self.config.scheduler.max_queue)
        for code in request_error_codes():
            metrics.REQUEST_ERRORS.labels(code=code)  # zeros from the start, so rate() and alerts work
        baseline = (self.loaded.manifest.performance_baseline or {}) if self.loaded.manifest else {}
        metrics.TOKENS_PER_SECOND_BASELINE.set(float(baseline.get("tokens_per_s") or 0.0))
        if background_warmup:
            threading.Thread(target=self._warm_then_serve, name="aieng-warmup", daemon=True).start()
        else:
            self._warm_then_serve()

    def _build_engine(self) -> Engine:
        return Engine(self.loaded.model, self.loaded.tokenizer, context_length=self.loaded.context_length,
                      config=self.config.engine)

    def _warm_then_serve(self) -> None:
        self.warmup_seconds = self.engine.warmup()
        log.info("warm-up took %.2fs; ready", self.warmup_seconds)
        self.engine_loop.start()
        self.ready = True

    def require_ready(self) -> None:
        if self.draining:
            raise NotReadyError("the server is draining; retry on another instance")
        if not self.ready:
            raise NotReadyError("the model is loading or warming up; retry when /health/ready returns 200")

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """For generation routes: a request that reaches a worker still warming up waits for it
        (several workers share one socket, so a client cannot choose a warm one) instead of
        failing; /health/ready keeps answering 503 until warm, for probes."""
        import asyncio

        deadline = time.monotonic() + timeout_s
        while not self.ready and not self.draining and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.require_ready()

    def drain(self) -> None:
        """Readiness turns 503 and no new request is admitted; in-flight ones finish."""
        self.draining = True
        if self.engine_loop is not None:
            self.engine_loop.scheduler.drain()

    def stop(self) -> None:
        if self.engine_loop is not None:
            self.engine_loop.stop()


@contextlib.contextmanager
def _one_torch_thread():
    """Run model work in the master on one thread: no OpenMP pool may exist when workers fork."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
