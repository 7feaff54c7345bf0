"""The engine thread: one loop that owns the engine and runs continuous batching.

Each iteration: apply cancellations (client gone) and deadlines, take the joiners the policy
admits, run ``engine.step(joiners)`` (prefill the joiners, then one decode step for every running
row), and hand each event to its request's sink. Finished, cancelled and timed-out rows leave the
batch before the next step.

Threads: ``submit`` and ``cancel`` are called from the event loop (or any thread); everything
else runs on the engine thread. Sinks are called on the engine thread and must not block — the
server's sink is ``loop.call_soon_threadsafe(queue.put_nowait, event)``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from aieng.engine.engine import GenerationRequest, TokenEvent
from aieng.errors import AiengError, NotReadyError
from aieng.scheduler.policy import QueuedRequest, QueueFullError, SchedulerConfig, WaitingQueue

log = logging.getLogger("aieng.scheduler")


class OverloadedError(AiengError):
    code = "overloaded"
    status = 429
    type = "server_error"

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(AiengError):
    code = "timeout"
    status = 504
    type = "server_error"


class EngineLoop:
    def __init__(self, engine, config: SchedulerConfig = SchedulerConfig(), *,
                 clock: Callable[[], float] = time.monotonic, observer=None):
        self.engine = engine
        self.config = config
        self.clock = clock
        self.observer = observer  # optional: on_admit / on_step / on_idle callbacks (aieng.scheduler.observer)
        self.queue = WaitingQueue(config)
        self._running: dict[str, QueuedRequest] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.accepting = True
        # (clock, running rows, waiting requests) after every step: notebook 05 plots it
        self.history: collections.deque = collections.deque(maxlen=10_000)

    # -- called from the event loop ------------------------------------------------------------
    def submit(self, request: GenerationRequest, sink: Callable[[TokenEvent], None], *,
               priority: str = "interactive", timeout: float | None = None) -> QueuedRequest:
        """Queue a validated request; its events go to ``sink``. Raises OverloadedError (429)."""
        if not self.accepting:
            raise NotReadyError("the server is draining and accepts no new requests")
        now = self.clock()
        timeout = self.config.default_timeout_s if timeout is None else timeout
        item = QueuedRequest(request, priority=priority, arrival=now, deadline=now + timeout, sink=sink)
        with self._wake:
            try:
                self.queue.add(item)
            except QueueFullError as exc:
                raise OverloadedError(f"server overloaded: {exc}; retry shortly", retry_after=1) from exc
            self._wake.notify()
        return item

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is; its row leaves before the next decode step."""
        with self._wake:
            self._cancelled.add(request_id)
            self._wake.notify()

    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    @property
    def num_running(self) -> int:
        return len(self._running)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "EngineLoop":
        self._thread = threading.Thread(target=self._run, name="aieng-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def drain(self) -> None:
        """Stop admitting; what is queued or running still finishes."""
        self.accepting = False

    def idle(self) -> bool:
        return not self._running and not len(self.queue)

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._has_work():
                    self._wake.wait(timeout=self._sleep_for())
                if self._stopping:
                    return
            try:
                self.run_once()
            except Exception:  # a bug must not kill the thread: fail what was in flight, keep serving
                log.exception("engine step failed; failing the requests in flight")
                self._fail_everything(AiengError("internal error in the generation engine; the server log has it"))

    def _has_work(self) -> bool:
        return bool(self._running or self._cancelled or self._ready_to_admit(self.clock()))

    def _sleep_for(self) -> float | None:
        oldest = self.queue.oldest_arrival()
        if oldest is None:
            return None
        return max(0.0, oldest + self.config.max_queue_delay_ms / 1000 - self.clock())

    def _ready_to_admit(self, now: float) -> bool:
        """An idle engine waits up to max_queue_delay_ms so that a burst prefills together."""
        if not len(self.queue):
            return False
        if self._running or len(self.queue) >= self.config.max_batch_size:
            return True
        return now - self.queue.oldest_arrival() >= self.config.max_queue_delay_ms / 1000

    def run_once(self) -> list[TokenEvent]:
        """One iteration (public so tests can drive the loop step by step with a fake engine)."""
        now = self.clock()
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            for request_id in cancelled:
                self.queue.remove(request_id)
            expired = self.queue.expired(now)
            admit = self._ready_to_admit(now)
            joiners = self.queue.pop_joiners(now, self.config.max_batch_size - len(self._running)) if admit else []
        late = [q for q in self._running.values() if q.deadline is not None and q.deadline <= now]
        gone = [rid for rid in cancelled if rid in self._running]
        self.engine.remove(gone + [q.request_id for q in late])
        for request_id in gone:
            self._running.pop(request_id, None)
        for q in expired + late:
            self._running.pop(q.request_id, None)
            log.warning("request passed its deadline", extra={"event": "request_timeout", "trace_id": q.request.trace_id,
                                                              "waited_s": round(now - q.arrival, 3)})
            self._send(q, _timeout_event(q))
        for q in joiners:
            self._running[q.request_id] = q
            q.admitted_at = now
            if self.observer is not None:
                self.observer.on_admit(q, now)
        events = self.engine.step([q.request for q in joiners]) if (joiners or self._running) else []
        done_at = self.clock()
        prefill_s = getattr(self.engine, "last_timings", (None,))[0]
        for q in joiners:
            q.prefill_s = prefill_s
        deliveries = []
        for event in events:
            q = self._running.get(event.request_id)
            if q is None:
                continue
            if q.first_token_at is None:
                q.first_token_at = done_at
            if event.finished:
                q.finished_at = done_at
                del self._running[event.request_id]
            deliveries.append((q, event))
        self.history.append((self.clock(), self.engine.num_running, len(self.queue)))
        if self.observer is not None:  # before delivery: a client that sees a token sees the gauges too
            if events:
                self.observer.on_step(self.engine, len(self._running), len(self.queue))
            if not self._running:
                self.observer.on_idle(len(self.queue))
        for q, event in deliveries:
            self._send(q, event)
        return events

    def _send(self, q: QueuedRequest, event: TokenEvent) -> None:
        try:
            q.sink(event)
        except Exception:
            log.exception("a request's sink failed; dropping request %s", q.request_id)
            self.cancel(q.request_id)

    def _fail_everything(self, error: AiengError) -> None:
        self.engine.remove(list(self._running))
        for q in list(self._running.values()):
            self._send(q, TokenEvent(q.request_id, None, "", finished=True, finish_reason="error", error=error))
        self._running.clear()


def _timeout_event(q: QueuedRequest) -> TokenEvent:
    error = RequestTimeoutError("the request did not finish before its deadline (`timeout`); "
                                "raise the timeout or lower max_tokens")
    return TokenEvent(q.request_id, None, "", finished=True, finish_reason="error", finish_cause="error",
                      prompt_tokens=q.prompt_tokens, error=error)
