"""One model version being served: its weights, engine, engine thread, scheduler bridge and
request builder, held together so a request captures them once.

Why one object: during a hot swap two versions are live in the worker, the old finishing its
in-flight requests while new ones go to the new. A request that read the tokenizer of one and
the scheduler of the other would decode with the wrong vocabulary; reading ``runtime.serving``
once at the start of a request and using only that makes the switch a single reference
assignment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aieng.engine import Engine
from aieng.errors import request_error_codes
from aieng.loading.loader import LoadedModel
from aieng.observability import metrics
from aieng.observability.observer import MetricsObserver, StepLog, StepObserver
from aieng.scheduler import EngineLoop, SchedulerConfig
from aieng.server.http.bridge import Bridge
from aieng.server.http.inputs import RequestBuilder
from aieng.store.hashing import fingerprint


@dataclass
class Serving:
    name: str
    version: str
    loaded: LoadedModel
    engine: Engine
    engine_loop: EngineLoop
    bridge: Bridge
    inputs: RequestBuilder

    @classmethod
    def build(cls, name: str, loaded: LoadedModel, engine: Engine, scheduler: SchedulerConfig, settings) -> Serving:
        """Wire the engine to a scheduler thread (not started) and the HTTP side; ``settings``
        (``aieng.settings.Settings``) gives metrics on/off, the stream buffer and the test delay."""
        observers = [MetricsObserver(version=loaded.version)] if settings.metrics else []
        observers.append(StepLog(settings.log_step_every, version=loaded.version))
        delay_s = step_delay(settings, loaded.version)
        if delay_s > 0:  # AIENG_TEST_STEP_DELAY: a version made slow on purpose, for tests
            observers.append(StepDelay(delay_s))
        loop = EngineLoop(engine, scheduler, observers=observers)
        bridge = Bridge(
            loop.scheduler,
            metrics_enabled=settings.metrics,
            version=loaded.version,
            buffer_events=settings.stream_buffer_events,
        )
        return cls(name, loaded.version, loaded, engine, loop, bridge, RequestBuilder(engine))

    @property
    def template(self) -> dict:
        """The chat template's ``{sha256, version, source}`` from the manifest ({} without one)."""
        manifest = self.loaded.manifest
        return dict((manifest.prompt_template or {}) if manifest else {})

    @property
    def in_flight(self) -> int:
        scheduler = self.engine_loop.scheduler
        return scheduler.num_running + scheduler.num_waiting

    def publish(self, serving: bool) -> None:
        """``aieng_model_info{name,version,sha256}`` of this process: 1 while it serves this version."""
        manifest = self.loaded.manifest
        sha = fingerprint(manifest.files) if manifest else ""
        metrics.MODEL_INFO.labels(name=self.name, version=self.version, sha256=sha).set(1 if serving else 0)
        if serving:
            metrics.zero_series(self.version, request_error_codes())

    def retire(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Stop admitting, let in-flight requests finish (up to ``timeout_s``), stop the engine
        thread. True when nothing was left running."""
        self.engine_loop.scheduler.drain()
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(poll_s)
        finished = not self.in_flight
        self.engine_loop.stop()
        return finished


class StepDelay(StepObserver):
    """Sleeps after every step of one engine (``AIENG_TEST_STEP_DELAY``): the test-only way to make
    a version that answers correctly but slowly, so the canary's latency checks can be seen to fire."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step(self, step, running: int, waiting: int, now: float) -> None:
        time.sleep(self.seconds)


def step_delay(settings, version: str) -> float:
    """``AIENG_TEST_STEP_DELAY``'s delay for ``version`` (``3=0.05,4=0.1``), 0 when unnamed."""
    for item in filter(None, (part.strip() for part in settings.test_step_delay.split(","))):
        named, _, seconds = item.partition("=")
        if named == version:
            return float(seconds)
    return 0.0
