"""The engine thread: one loop that owns the engine and runs continuous batching.

Each iteration is the scheduler's two calls around one engine step::

    plan = scheduler.schedule(now)                      # joiners, leavers, expired requests
    step = engine.step(plan.requests, plan.leaving)     # drop, prefill, decode
    deliveries = scheduler.update(step, now)            # events -> each request's sink

Sinks are called on this thread and must not block (the server's sink posts to the event loop's
mailbox). Requests are submitted to ``loop.scheduler`` from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from aieng.engine.request import StepResult
from aieng.errors import AiengError
from aieng.observability.observer import StepHistory
from aieng.scheduler.policy import SchedulerConfig
from aieng.scheduler.scheduler import Delivery, Scheduler

log = logging.getLogger("aieng.scheduler")


class EngineLoop:
    def __init__(self, engine, config: SchedulerConfig = SchedulerConfig(), *, clock=None, observers: Sequence = ()):
        self.engine = engine
        self.step_history = StepHistory()  # (time, running, waiting) after every step: notebook 05 plots it
        kwargs = {"clock": clock} if clock is not None else {}
        self.scheduler = Scheduler(
            config,
            observers=[*observers, self.step_history],
            capacity=lambda: getattr(engine, "max_rows", None),
            **kwargs,
        )
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._calls: list[tuple[Callable, Future]] = []  # run on this thread between two steps
        self._closed = False  # the thread has taken its last calls
        self.step_started: float | None = None  # time.monotonic() when the running step began (the watchdog's)
        self._plan = None  # the running step's plan, for step_shape()

    @property
    def history(self):
        return self.step_history.points

    def run_once(self) -> StepResult:
        """One iteration (public so tests drive the loop step by step with a fake engine)."""
        clock = self.scheduler.clock
        plan = self._plan = self.scheduler.schedule(clock())
        step = self.engine.step(plan.requests, plan.leaving) if plan.runs_engine else StepResult()
        self._deliver(plan.failed + self.scheduler.update(step, clock()))
        return step

    def call_between_steps(self, fn: Callable):
        """Run ``fn()`` on the engine thread between two steps (at once on this thread when the
        loop is not running) and return a Future of its result: how a hot swap changes the
        engine's KV cache without racing a step."""
        future: Future = Future()
        with self.scheduler.wake:
            queued = not self._closed and self._thread is not None and self._thread.is_alive()
            if queued:
                self._calls.append((fn, future))
                self.scheduler.wake.notify()
        if not queued:
            _settle(future, fn)
        return future

    def step_shape(self) -> dict:
        """What the running step is doing, for the log line of a step that does not end."""
        plan = self._plan
        joiners = plan.requests if plan is not None else []
        return {
            "running_rows": len(self.scheduler.running),
            "joining_rows": len(joiners),
            "joining_prompt_tokens": sum(len(r.prompt_ids) for r in joiners),
            "leaving_rows": len(plan.leaving) if plan is not None else 0,
            "waiting": self.scheduler.num_waiting,
        }

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> EngineLoop:
        self._thread = threading.Thread(target=self._run, name="aieng-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self.scheduler.wake:
            self._stopping = True
            self.scheduler.wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            with scheduler.wake:
                while not self._stopping and not self._calls and not scheduler.has_work(scheduler.clock()):
                    scheduler.wake.wait(timeout=scheduler.sleep_for(scheduler.clock()))
                calls, self._calls = self._calls, []
                self._closed = self._stopping  # from here calls run on the caller's thread
            for fn, future in calls:
                _settle(future, fn)
            if self._closed:
                return
            try:
                self.step_started = time.monotonic()
                self.run_once()
            except Exception:  # a bug must not kill the thread: fail what was in flight, keep serving
                log.exception("engine step failed; failing the requests in flight")
                leaving, deliveries = scheduler.fail_running(
                    AiengError("internal error in the generation engine; the server log has it")
                )
                self.engine.remove(leaving)
                self._deliver(deliveries)
            finally:
                self.step_started = None

    def _deliver(self, deliveries: list[Delivery]) -> None:
        for q, event in deliveries:
            try:
                q.sink(event)
            except Exception:
                log.exception("a request's sink failed; dropping request %s", q.request_id)
                self.scheduler.cancel(q.request_id)


def _settle(future: Future, fn: Callable) -> None:
    try:
        future.set_result(fn())
    except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
        future.set_exception(exc)
