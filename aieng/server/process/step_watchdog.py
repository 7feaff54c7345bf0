"""A watchdog over the engine thread: a step that does not end is a wedged worker, and says so.

Why: the event loop of a worker whose engine thread hangs (a deadlocked kernel, a driver stuck
in a CUDA call, an infinite loop in a tokenizer) stays perfectly healthy, so gunicorn's
heartbeat, the liveness probe and every request that is not yet generating see nothing wrong,
while every generation on that worker waits forever. The watchdog compares the running step's
age with ``AIENG_STEP_TIMEOUT_S`` and, past it:

1. logs ``engine_step_stuck`` with the step's shape (rows running, joining, their prompt
   tokens, the queue), the one line an operator needs to reproduce it;
2. turns ``/health/ready`` to 503 (``status: stuck``) and refuses new requests, so load
   balancers move traffic away;
3. after ``exit_after_s`` asks the process to stop (``on_stuck``: in a gunicorn worker a SIGTERM
   to itself, i.e. the usual drain), so the process manager starts a fresh worker.

The timeout must exceed the slowest healthy step: a long prompt's prefill on a big model can take
tens of seconds on a CPU. A step that is compiling a graph warm-up missed (the transformers
path's rewarm, minutes on a big model) is not judged while it compiles.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("aieng.server")


class StepWatchdog:
    def __init__(
        self,
        runtime,
        timeout_s: float,
        *,
        exit_after_s: float,
        poll_s: float | None = None,
        on_stuck: Callable[[], None] | None = None,
    ):
        self.runtime = runtime
        self.timeout_s = timeout_s
        self.exit_after_s = exit_after_s
        self.poll_s = poll_s if poll_s is not None else min(1.0, timeout_s / 4)
        self.on_stuck = on_stuck
        self.fired = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StepWatchdog:
        self._thread = threading.Thread(target=self._run, name="aieng-step-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def check(self, now: float | None = None) -> bool:
        """One look at every live engine thread; True (and the actions above) once one is stuck."""
        now = time.monotonic() if now is None else now
        for serving in filter(None, (self.runtime.serving, self.runtime.canary)):
            started = serving.engine_loop.step_started
            if started is None or serving.engine.compiling_inline:
                continue  # idle, or compiling a graph inside the step (the HF path's rewarm): slow, not wedged
            if now - started > self.timeout_s:
                self._fire(serving, now - started, serving.engine_loop.step_shape())
                return True
        return False

    def _fire(self, serving, age_s: float, shape: dict) -> None:
        message = (
            f"the engine step of {serving.name}@{serving.version} has run {age_s:.0f} s, past "
            f"AIENG_STEP_TIMEOUT_S={self.timeout_s:g}: this worker is wedged and is being replaced; "
            "retry on another instance"
        )
        log.error(
            "engine step stuck for %.1f s (%s); marking the worker unready and stopping it in %.0f s",
            age_s,
            ", ".join(f"{k}={v}" for k, v in shape.items()),
            self.exit_after_s,
            extra={"event": "engine_step_stuck", "version": serving.version, "step_age_s": round(age_s, 1), **shape},
        )
        self.runtime.stuck = message
        self.fired.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.check():
                break
        else:
            return
        if self.on_stuck is not None and not self._stop.wait(self.exit_after_s):
            self.on_stuck()
