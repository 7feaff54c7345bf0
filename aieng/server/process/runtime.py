"""The serving runtime of one process: model, engine, engine thread, readiness.

Split in two phases because of the process model:

- ``prepare()`` runs in the gunicorn master before fork (``preload``): verify and load the
  weights with one torch thread (no OpenMP pool exists to be broken by fork), then
  ``gc.freeze()`` so the collector never writes to — and so un-shares — those pages. On CUDA
  nothing is loaded here: a CUDA context must never be created before fork.
- ``start()`` runs in each worker (the app's lifespan): torch threads for this worker, the
  engine, its thread, and warm-up in the background; ``/health/ready`` turns 200 when warm.

Both go through the named phases of ``startup.StartupProgress`` (``verify``, ``load``,
``warmup``, ``engine``, ``ready``): logged as they start and end, a heartbeat while they run, and
shown by ``/health/ready``'s 503 body.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from dataclasses import dataclass, replace

import torch

from aieng.engine import Engine, EngineConfig
from aieng.errors import ConfigError, NotReadyError
from aieng.loading.device import wants_cuda
from aieng.loading.loader import LoadConfig, LoadedModel, load_version
from aieng.observability import metrics
from aieng.observability.logs import set_service
from aieng.scheduler import EngineLoop, SchedulerConfig
from aieng.server.process import gpu_worker
from aieng.server.process.compile_cache import compile_cache_counts, compile_cache_delta
from aieng.server.process.hot_swap import HotSwapper
from aieng.server.process.model_threads import run_on_own_thread
from aieng.server.process.serving import Serving
from aieng.server.process.startup import FAILED, PhasedStore, StartupProgress
from aieng.server.process.step_watchdog import StepWatchdog
from aieng.settings import WEIGHT_FORMATS, Settings
from aieng.store import parse_ref

log = logging.getLogger("aieng.server")


@dataclass
class RuntimeConfig:
    settings: Settings
    engine: EngineConfig = EngineConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    torch_threads: int | None = None  # per worker; None = leave torch's default
    drain_delay_s: float = 1.0  # after SIGTERM: report 503 this long before closing the listener
    canary_engine: EngineConfig | None = None  # on CUDA: the KV budget kept for a canary (gpu_worker.py)

    @classmethod
    def from_settings(cls, settings: Settings) -> RuntimeConfig:
        """The one place where ``Settings`` (environment and flags) become component configs."""
        for name, value, allowed in (
            ("AIENG_WEIGHT_FORMATS", settings.weight_formats, WEIGHT_FORMATS),
            ("AIENG_DECODE_ATTENTION", settings.decode_attention, ("auto", "sdpa")),
            ("AIENG_KV_CACHE_DTYPE", settings.kv_cache_dtype, ("auto", "model", "bfloat16")),
        ):
            if value not in allowed:
                raise ConfigError(f"{name}={value!r}: use {', '.join(allowed[:-1])} or {allowed[-1]}")
        engine = EngineConfig(
            compile=settings.compile,
            quantize_int8=settings.int8,
            native=settings.native,
            max_rows=settings.max_batch_size,
            kv_cache_bytes=settings.kv_cache_mb * 2**20,
            prefill_chunk_tokens=settings.prefill_chunk_tokens,
            weight_formats=settings.weight_formats,
            decode_attention=settings.decode_attention,
            kv_cache_dtype=settings.kv_cache_dtype,
            prefix_cache=settings.prefix_cache,
            compile_budget_s=settings.compile_budget_s,
            oom_degrade=settings.oom_degrade,
        )
        scheduler = SchedulerConfig(
            max_batch_size=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_queue=settings.max_queue,
            max_queue_delay_ms=settings.max_queue_delay_ms,
            default_timeout_s=settings.request_timeout_s,
        )
        return cls(settings=settings, engine=engine, scheduler=scheduler, drain_delay_s=settings.drain_delay_s)


class Runtime:
    def __init__(self, config: RuntimeConfig, progress: StartupProgress | None = None):
        self.config = config
        self.settings = config.settings
        self.ref = parse_ref(self.settings.model)
        self.loaded: LoadedModel | None = None
        self.engine: Engine | None = None
        self.serving: Serving | None = None  # what a request reads once: version, engine thread, bridge, inputs
        self.engine_loop: EngineLoop | None = None  # the engine thread; requests go to its scheduler
        self.bridge = None  # aieng.server.http.bridge.Bridge of the serving version
        self.inputs = None  # aieng.server.http.inputs.RequestBuilder of the serving version
        self.ready = False
        self.draining = False  # readiness is 503 (SIGTERM): balancers stop sending; requests still served
        self.admission_closed = False  # after the drain delay: new requests are refused
        self.stuck: str | None = None  # why, once the step watchdog found the engine thread wedged
        self.on_stuck = None  # () -> None: how this process ends itself once stuck (the gunicorn worker sets it)
        self.watchdog: StepWatchdog | None = None
        self.started_at = time.time()
        self.warmup_seconds: float | None = None
        self.model_name = self.ref.name
        self.model_version: str | None = None
        self.progress = progress or StartupProgress()  # the phase a starting process is in; /health/ready shows it
        self.canary: Serving | None = None  # the version served beside `serving` to a share of requests
        self.canary_weight = 0.0
        self.gpu_split = None  # aieng.host.gpus.SplitPlan when the weights span several GPUs (set before fork)
        self.verified: dict = {}  # versions hashed whole in this process or before fork (startup.PhasedStore)
        self.worker_plan = None  # aieng serve's WorkerPlan (set before fork): logged with the engine's choices
        self.swapper = HotSwapper(self)  # follows the store's `current` and canary record (hot_swap.py, canary.py)

    # -- master --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Verify (always) and, on CPU, load before fork. Raises AiengError when it must not serve."""
        load_config = LoadConfig.from_settings(self.settings)
        on_cuda = wants_cuda(load_config.device)
        store = PhasedStore(self.settings.store, self.progress, load_next=not on_cuda, verified=self.verified)
        try:
            version = store.resolve(self.ref)
            self.model_version = version
            if on_cuda:
                store.verify_or_raise(type(self.ref)(self.ref.name, version))  # load happens in the worker
                return
            with _one_torch_thread():  # load and fuse: a pool started here would slow every worker
                self.loaded = load_version(store, type(self.ref)(self.ref.name, version), load_config)
                self._prepare_native_forward()
        except BaseException as exc:
            self.progress.fail(exc)
            raise
        gc.collect()
        gc.freeze()

    def _prepare_native_forward(self) -> None:
        """Made once in the master, not in every worker: aieng's CPU kernels (built on a host's first
        start; the log says how long) and the layers' fused matrices, shared copy-on-write."""
        from aieng.engine.native import kernels
        from aieng.engine.native.model import fuse_layers
        from aieng.engine.serving_path import serving_path

        engine = self.config.engine
        native = serving_path(self.loaded.model.config, context_length=self.loaded.context_length).kind == "native"
        if engine.native and native:
            self.progress.detail("aieng's CPU kernels (built once per host, then loaded from the cache)")
            kernels.load()
            fuse_layers(self.loaded.model)

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
            seconds = self._warmup("in the master, before fork")
            if self.engine.compile_status == "compiling":  # a thread does not survive fork: finish here
                self.progress.detail("finishing compilation before fork (a background thread would not survive it)")
                self.engine.wait_for_compile()
        if self.engine.compiled:
            from torch._inductor.async_compile import shutdown_compile_workers

            shutdown_compile_workers()  # the compile pool's processes must not outlive warm-up in the master
        gc.collect()
        gc.freeze()
        return seconds

    # -- worker --------------------------------------------------------------------------------
    def start(self, *, background_warmup: bool = True) -> None:
        """Build the engine and start warming up; on a thread of its own, which ends with it,
        so the caller's thread keeps no OpenMP pool beside the engine's (model_threads.py)."""
        run_on_own_thread(self._start, background_warmup, name="aieng-start")

    def _start(self, background_warmup: bool) -> None:
        try:
            self._start_engine()
        except BaseException as exc:
            self.progress.fail(exc)
            raise
        if background_warmup:
            threading.Thread(target=self._warm_in_background, name="aieng-warmup", daemon=True).start()
        else:
            self._warm_then_serve()

    def _start_engine(self) -> None:
        if self.settings.test_start_delay_s:  # AIENG_TEST_START_DELAY_S: a start as slow as a large load
            time.sleep(self.settings.test_start_delay_s)
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        if self.loaded is None:  # CUDA (the master never loads there): this worker's GPU share first
            gpu_worker.apply_fraction(self)
            store = PhasedStore(self.settings.store, self.progress, load_next=True, verified=self.verified)
            self.loaded = load_version(store, self.ref, self.load_config())
            gpu_worker.fit_kv_to_gpu(self)  # the KV budget from what the weights and a probe left
        self.model_version = self.loaded.version
        self.progress.begin(
            "engine", f"building the engine and its scheduler, {torch.get_num_threads()} torch thread(s)"
        )
        if self.engine is None:  # not built before fork (CUDA, several torch threads, or in-process use)
            self.engine = self._build_engine()
        if self.engine.max_rows < self.config.scheduler.max_batch_size:  # the KV budget holds fewer rows
            log.warning(
                "the KV cache budget holds %d rows of %d tokens: max_batch_size lowered from %d to %d "
                "(raise AIENG_KV_CACHE_MB, or lower AIENG_MAX_BATCH_SIZE to silence this)",
                self.engine.max_rows,
                self.engine.context_length,
                self.config.scheduler.max_batch_size,
                self.engine.max_rows,
                extra={"event": "kv_budget_rows"},
            )
            self.config.scheduler = replace(self.config.scheduler, max_batch_size=self.engine.max_rows)
        self.install(Serving.build(self.model_name, self.loaded, self.engine, self.config.scheduler, self.settings))
        if self.worker_plan is not None:
            self.log_serving_plan()
        self.serving.publish(True)
        set_service(self.model_name, self.model_version)
        metrics.QUEUE_CAPACITY.set(self.config.scheduler.max_queue)
        metrics.SLO_E2E_P99.set(self.settings.slo_e2e_p99_s)
        baseline = (self.loaded.manifest.performance_baseline or {}) if self.loaded.manifest else {}
        metrics.TOKENS_PER_SECOND_BASELINE.set(float(baseline.get("tokens_per_s") or 0.0))

    def log_serving_plan(self) -> None:
        """One line: what this process's engine chose for the model, and the worker plan."""
        from aieng.engine.decisions import engine_decisions
        from aieng.server.process.serving_plan import ServingPlan

        plan = ServingPlan(self.model_name, self.model_version, engine_decisions(self.engine), self.worker_plan)
        log.info(plan.line(), extra={"event": "serving_plan", **plan.fields()})

    def install(self, serving: Serving) -> None:
        """Make ``serving`` the version new requests get: ``self.serving`` first (what a request
        reads, once), then the attributes status and drain code read."""
        self.serving = serving
        self.loaded, self.engine, self.model_version = serving.loaded, serving.engine, serving.version
        self.engine_loop, self.bridge, self.inputs = serving.engine_loop, serving.bridge, serving.inputs

    def load_config(self) -> LoadConfig:
        """How this process loads a version (its own, a hot swap's, a canary's): the settings,
        plus the split across GPUs when the worker plan chose one."""
        config = LoadConfig.from_settings(self.settings)
        if self.gpu_split is not None:
            config = replace(config, max_memory=self.gpu_split.max_memory)
        return config

    def _build_engine(self) -> Engine:
        return Engine(
            self.loaded.model,
            self.loaded.tokenizer,
            context_length=self.loaded.context_length,
            config=self.config.engine,
        )

    def _warm_in_background(self) -> None:
        with contextlib.suppress(Exception):  # already logged as startup_failed; /health/ready says so
            self._warm_then_serve()

    def _warm_then_serve(self) -> None:
        try:
            self.warmup_seconds = self._warmup("in the worker")
            self.engine_loop.start()
        except BaseException as exc:  # logged with its traceback; /health/ready answers 503 "failed"
            self.progress.fail(exc)
            raise
        self.ready = True
        self.progress.finish(warmup_s=round(self.warmup_seconds, 2))
        self.swapper.watch()
        if self.settings.step_timeout_s > 0:
            self.watchdog = StepWatchdog(
                self, self.settings.step_timeout_s, on_stuck=self.on_stuck, exit_after_s=self.config.drain_delay_s + 1.0
            ).start()
        if self.engine.compile_status == "compiling":  # past its compile budget: serving eagerly meanwhile
            self.progress.begin("compile", "in the background; serving eagerly until the graphs are ready")
            threading.Thread(target=self._watch_compile, name="aieng-compile-watch", daemon=True).start()

    def _watch_compile(self) -> None:
        while self.engine.compile_status == "compiling":
            time.sleep(0.5)
        self.progress.finish(compile_status=self.engine.compile_status)

    def _warmup(self, where: str) -> float:
        """``Engine.warmup`` as the ``warmup`` phase: each shape it runs becomes the phase's detail."""
        mode = "compile on" if self.engine.config.compile else "compile off (eager)"
        before = compile_cache_counts()
        self.progress.begin("warmup", f"{mode}, {where}")
        seconds = self.engine.warmup(progress=self.progress.detail)
        cache = compile_cache_delta(before)
        self.progress.detail(
            f"done in {seconds:.1f}s" + (f"; compile cache {cache}" if cache else ""), compile_cache=cache
        )
        return seconds

    def require_ready(self) -> None:
        if self.stuck:
            raise NotReadyError(self.stuck, code="engine_stuck")
        if self.admission_closed:
            raise NotReadyError("the server is draining; retry on another instance")
        if not self.ready and self.progress.phase == FAILED:
            raise NotReadyError("this worker failed to start (its log says why); retry on another instance")
        if not self.ready:
            raise NotReadyError("the model is loading or warming up; retry when /health/ready returns 200")

    def readiness(self) -> tuple[int, dict]:
        """/health/ready's status code and body: 503 with the error envelope, ``status``
        (``starting``, ``failed``, ``draining``, ``stuck``) and, while starting, the phase, its detail and
        seconds in it; 200 with the model, plus the phase when the engine runs one while serving."""
        try:
            if self.draining and not self.stuck:
                raise NotReadyError("the server is draining; retry on another instance")
            self.require_ready()
        except NotReadyError as exc:
            if self.stuck:
                return 503, {**exc.envelope(), "status": "stuck"}
            if self.draining:
                return 503, {**exc.envelope(), "status": "draining"}
            snapshot = self.progress.snapshot()
            return 503, {
                **exc.envelope(),
                "status": "failed" if snapshot["phase"] == FAILED else "starting",
                **snapshot,
            }
        body = {"status": "ready", "model": self.model_name, "version": self.model_version}
        if self.loaded is not None:  # on a GPU host, the GPU this worker is pinned to
            body["device"] = str(self.loaded.device)
        if self.serving is not None and self.serving.template:
            body["template_version"] = self.serving.template.get("version")
        if self.swapper.last is not None:  # the last hot swap, failed ones included: the old version still serves
            body["swap"] = self.swapper.last.to_dict()
        if self.canary is not None:
            body["canary"] = self.swapper.canary.describe()
        if self.progress.running:  # a phase the engine runs while serving (a background compile)
            body.update(self.progress.snapshot())
        return 200, body

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """For generation routes: a request that reaches a worker still warming up waits for it
        (several workers share one socket, so a client cannot choose a warm one) instead of
        failing; /health/ready keeps answering 503 until warm, for probes."""
        import asyncio

        deadline = time.monotonic() + timeout_s
        while (
            not self.ready
            and not self.admission_closed
            and self.progress.phase != FAILED
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.05)
        self.require_ready()

    def drain(self) -> None:
        """Lame duck: readiness turns 503 so that load balancers stop sending, but what still
        arrives is served, for the drain delay, until ``close_admission``. A balancer that only
        polls health checks (HAProxy, nginx plus, a cloud LB) notices a few checks later; a
        request it sent meanwhile must not fail."""
        self.draining = True

    def close_admission(self) -> None:
        """After the drain delay: no new request is admitted (503 ``not_ready``, retryable);
        in-flight ones finish."""
        self.draining = self.admission_closed = True
        if self.engine_loop is not None:
            self.engine_loop.scheduler.drain()
        if self.canary is not None:
            self.canary.engine_loop.scheduler.drain()

    def stop(self) -> None:
        self.swapper.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.engine_loop is not None:
            self.engine_loop.stop()
        if self.canary is not None:
            self.canary.engine_loop.stop()


@contextlib.contextmanager
def _one_torch_thread():
    """Run model work in the master on one thread: no OpenMP pool may exist when workers fork (each
    worker inherits the pool's bookkeeping but not its threads, and its parallel kernels crawl)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
