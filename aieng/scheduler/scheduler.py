"""The scheduler: the one owner of every request from queueing to its last token.

Two calls per step, in vLLM v1's shape:

- ``schedule(now)`` decides what the next engine step does: which waiting requests join
  (the policy in ``policy.py``), which running rows leave (cancelled, past their deadline), and
  which requests fail without running (deadline passed while waiting);
- ``update(step, now)`` takes the engine's ``StepResult`` and turns its events into deliveries,
  stamps each request's ``RequestStats`` and reports the step to the observers.

The engine keeps the batch's tensors (one row per running request); the scheduler keeps
everything about the requests: waiting and running sets, priorities, deadlines, sinks, timings.
The two stay in step because the engine drops exactly the rows ``schedule`` names in ``leaving``
and the rows it reports finished.

Threads: ``submit``, ``cancel`` and ``drain`` are called from the event loop (or any thread) and
take the lock; ``schedule`` and ``update`` run on the engine thread.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aieng.engine.request import GenerationRequest, StepResult, TokenEvent, error_event
from aieng.errors import AiengError, NotReadyError
from aieng.scheduler.policy import QueuedRequest, QueueFullError, SchedulerConfig, WaitingQueue

log = logging.getLogger("aieng.scheduler")


class OverloadedError(AiengError):
    code = "overloaded"
    status = 429
    type = "server_error"
    request_path = True

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(AiengError):
    code = "timeout"
    status = 504
    type = "server_error"
    request_path = True


Delivery = tuple[QueuedRequest, TokenEvent]


@dataclass
class SchedulerOutput:
    """What the next engine step does, and who fails without it."""

    joiners: list[QueuedRequest] = field(default_factory=list)
    leaving: list[str] = field(default_factory=list)  # running request ids to drop before the step
    failed: list[Delivery] = field(default_factory=list)  # final error events (deadline passed)
    runs_engine: bool = False  # False: nothing to prefill, decode or drop

    @property
    def requests(self) -> list[GenerationRequest]:
        return [q.request for q in self.joiners]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig = SchedulerConfig(),
        *,
        clock: Callable[[], float] = time.monotonic,
        observers: Sequence = (),
        capacity: Callable[[], int | None] | None = None,
    ):
        """``capacity``: the rows the engine holds now, when that can fall below
        ``max_batch_size`` (during a hot swap the two versions share one KV cache)."""
        self.config = config
        self.capacity = capacity
        self.clock = clock  # arrival times; the engine thread passes the same clock's ``now`` to each step
        self.observers = list(observers)  # aieng.observability.observer.StepObserver
        self.queue = WaitingQueue(config)
        self.running: dict[str, QueuedRequest] = {}
        self.accepting = True
        self.wake = threading.Condition()  # guards queue and cancellations; notified on new work
        self._cancelled: set[str] = set()
        self._joined: list[QueuedRequest] = []  # the joiners of the step being run, for their prefill time
        self._finishes: collections.deque[float] = collections.deque(maxlen=65)  # recent finish times: drain rate
        self._first_admitted: float | None = None

    # -- from the event loop -------------------------------------------------------------------
    def submit(
        self,
        request: GenerationRequest,
        sink: Callable[[TokenEvent], None],
        *,
        priority: str = "interactive",
        timeout: float | None = None,
    ) -> QueuedRequest:
        """Queue a validated request; its events go to ``sink``. Raises OverloadedError (429)."""
        now = self.clock()
        timeout = self.config.default_timeout_s if timeout is None else timeout
        item = QueuedRequest(request, priority=priority, arrival=now, deadline=now + timeout, sink=sink)
        with self.wake:  # checked under the lock: after drain() returns, nothing more is queued
            if not self.accepting:
                raise NotReadyError("the server is draining and accepts no new requests")
            try:
                self.queue.add(item)
            except QueueFullError as exc:
                wait = self.retry_after(now)
                raise OverloadedError(f"server overloaded: {exc}; retry in {wait} s", retry_after=wait) from exc
            self.wake.notify()
        return item

    def cancel(self, request_id: str) -> None:
        """Drop a request wherever it is; a running row leaves before the next decode step."""
        with self.wake:
            self._cancelled.add(request_id)
            self.wake.notify()

    def drain(self) -> None:
        """Stop admitting; what is queued or running still finishes."""
        with self.wake:
            self.accepting = False

    def retry_after(self, now: float) -> int:
        """Seconds until the queue has drained at the recent completion rate (1 to 60).

        The rate is the last 64 completions over the time they took (up to now), so a stalled
        engine (no completions lately) asks clients to wait longer. Before anything has finished
        there is no rate to go on: 1 s."""
        finishes = list(self._finishes)
        if not finishes or self._first_admitted is None:
            return 1
        if len(finishes) == self._finishes.maxlen:  # 64 completions since the oldest kept one
            done, since = len(finishes) - 1, finishes[0]
        else:  # every completion so far, since work began
            done, since = len(finishes), self._first_admitted
        rate = done / max(now - since, 1e-3)
        return max(1, min(60, math.ceil(len(self.queue) / rate)))

    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def idle(self) -> bool:
        return not self.running and not len(self.queue)

    # -- on the engine thread ------------------------------------------------------------------
    def has_work(self, now: float) -> bool:
        return bool(self.running or self._cancelled or self._ready_to_admit(now))

    def sleep_for(self, now: float) -> float | None:
        """How long the engine thread may sleep before the oldest waiting request must be admitted."""
        oldest = self.queue.oldest_arrival()
        if oldest is None or self._room() <= 0:  # a hot swap's call (which notifies) brings room
            return None
        return max(0.0, oldest + self.config.max_queue_delay_ms / 1000 - now)

    def schedule(self, now: float) -> SchedulerOutput:
        with self.wake:
            cancelled, self._cancelled = self._cancelled, set()
            for request_id in cancelled:
                self.queue.remove(request_id)
            expired = self.queue.expired(now)
            free = self._room()
            joiners = self.queue.pop_joiners(now, free) if self._ready_to_admit(now) else []
        late = [q for q in self.running.values() if q.deadline is not None and q.deadline <= now]
        leaving = [rid for rid in cancelled if rid in self.running] + [q.request_id for q in late]
        for request_id in leaving:
            del self.running[request_id]
        for q in expired + late:
            log.warning(
                "request passed its deadline",
                extra={
                    "event": "request_timeout",
                    "trace_id": q.request.trace_id,
                    "waited_s": round(now - q.arrival, 3),
                },
            )
        if joiners and self._first_admitted is None:
            self._first_admitted = now
        for q in joiners:
            self.running[q.request_id] = q
            q.stats.admitted_at = now
            for observer in self.observers:
                observer.on_admit(q, now)
        self._joined = joiners
        return SchedulerOutput(
            joiners=joiners,
            leaving=leaving,
            failed=[(q, _timeout_event(q)) for q in expired + late],
            runs_engine=bool(joiners or leaving or self.running),
        )

    def update(self, step: StepResult, now: float) -> list[Delivery]:
        """Events of ``step`` to deliveries, in order; the observers see the step before any client does."""
        for q in self._joined:
            q.stats.prefill_s = step.prefill_s
        self._joined = []
        deliveries = []
        for event in step.events:
            q = self.running.get(event.request_id)
            if q is None:  # cancelled while the step ran
                continue
            if q.stats.first_token_at is None:
                q.stats.first_token_at = now
            if event.finished:
                q.stats.finished_at = now
                del self.running[event.request_id]
                self._finishes.append(now)
            deliveries.append((q, event))
        for observer in self.observers:
            if step.events:
                observer.on_step(step, len(self.running), len(self.queue), now)
            if not self.running:
                observer.on_idle(len(self.queue), now)
        return deliveries

    def fail_running(self, error: AiengError) -> tuple[list[str], list[Delivery]]:
        """After an engine failure: every running request ends with ``error``; returns their ids too."""
        failed = list(self.running.values())
        self.running.clear()
        self._joined = []
        return [q.request_id for q in failed], [(q, error_event(q.request_id, error)) for q in failed]

    def _room(self) -> int:
        """Rows that may join now: the batch size, or fewer while the engine holds fewer."""
        held = self.capacity() if self.capacity is not None else None
        rows = self.config.max_batch_size if held is None else min(self.config.max_batch_size, held)
        return rows - sum(q.rows for q in self.running.values())

    def _ready_to_admit(self, now: float) -> bool:
        """A busy engine admits between steps; an idle one admits at once, or (``max_queue_delay_ms``
        above 0) waits that long for companions so that a burst prefills together: every lone
        request pays the wait in its time to first token, so the default does not wait."""
        if not len(self.queue) or self._room() <= 0:
            return False
        if self.running or len(self.queue) >= self.config.max_batch_size:
            return True
        return now - self.queue.oldest_arrival() >= self.config.max_queue_delay_ms / 1000


def _timeout_event(q: QueuedRequest) -> TokenEvent:
    error = RequestTimeoutError(
        "the request did not finish before its deadline (`timeout`); raise the timeout or lower max_tokens"
    )
    return error_event(q.request_id, error, prompt_tokens=q.prompt_tokens)
