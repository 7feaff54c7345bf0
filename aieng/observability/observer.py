"""What the scheduler reports after each step, and the observers that listen.

One interface (``StepObserver``) feeds both the Prometheus metrics and the in-memory step history
that notebook 05 plots. All calls come from the engine thread, in this order per iteration:
``on_admit`` for each request that joins, ``on_step`` when the engine produced events, ``on_idle``
when no request is left running. They run before any token of the step reaches a client, so a
client that has seen a token can already see the gauges that step moved.
"""

from __future__ import annotations

import collections
import logging
import time


class StepObserver:
    """Every method is optional: the defaults do nothing."""

    def on_admit(self, queued, now: float) -> None:
        """``queued`` (a ``QueuedRequest``) joined the running batch at scheduler time ``now``."""

    def on_step(self, step, running: int, waiting: int, now: float) -> None:
        """``step`` (a ``StepResult``) ran; ``running`` and ``waiting`` are the counts after it."""

    def _count_prefix(self, prefix: dict[str, int]) -> None:
        m = self.metrics
        for result in ("hit", "miss"):
            if prefix[result]:
                m.PREFIX_CACHE_TOKENS.labels(result=result).inc(prefix[result])
        if prefix["evicted"]:
            m.PREFIX_CACHE_EVICTED.inc(prefix["evicted"])
        if prefix["kept"] != self._kept:  # a locked write to a shared file: only when it moved
            m.PREFIX_CACHE_KEPT.set(prefix["kept"])
            self._kept = prefix["kept"]

    def on_idle(self, waiting: int, now: float) -> None:
        """Nothing is running after this iteration."""


class StepHistory(StepObserver):
    """(scheduler time, running, waiting) after every step, the most recent ``maxlen`` of them."""

    def __init__(self, maxlen: int = 10_000):
        self.points: collections.deque = collections.deque(maxlen=maxlen)

    def on_step(self, step, running: int, waiting: int, now: float) -> None:
        self.points.append((now, running, waiting))

    def on_idle(self, waiting: int, now: float) -> None:
        if not self.points or self.points[-1][0] != now:
            self.points.append((now, 0, waiting))


class MetricsObserver(StepObserver):
    """Scheduler and engine metrics: queue wait, prefill and decode times, batch size, gauges.

    ``aieng_tokens_per_second`` is decoded tokens over a sliding ``window_s``, kept as a running
    sum (summing ~1000 deque entries every step cost more than the rest of this method).
    """

    def __init__(self, window_s: float = 5.0, resource_every_s: float = 1.0, *, version: str = ""):
        from aieng.observability import metrics  # see aieng.observability.prom: import order matters

        self.metrics = metrics
        self.version = version  # the label of the queue wait this engine's requests had
        self.window_s = window_s
        self.resource_every_s = resource_every_s
        self._last_resources = 0.0
        self._tokens: collections.deque = collections.deque()  # (time, tokens decoded)
        self._tokens_in_window = 0
        self._kv: tuple | None = None  # the KV gauges' last values
        self._kept: int | None = None  # the prefix cache gauge's last value

    def on_admit(self, queued, now: float) -> None:
        waited = max(0.0, now - queued.arrival)
        self.metrics.QUEUE_WAIT.labels(priority=queued.priority, version=self.version).observe(waited)

    def on_step(self, step, running: int, waiting: int, now: float) -> None:
        m = self.metrics
        if step.prefill_s is not None:
            m.PREFILL_SECONDS.observe(step.prefill_s)
        if step.decode_s is not None:
            m.DECODE_STEP_SECONDS.observe(step.decode_s)
            m.BATCH_SIZE.observe(step.decoded_rows)
        if step.prefill_s is not None or step.decode_s is not None:
            m.STEP_TOKENS.observe(step.prefill_tokens + step.decoded_rows)
        if step.kv_rows_total:
            kv = (step.kv_rows, step.kv_rows_total, step.kv_tokens, step.kv_tokens_total)
            gauges = (m.KV_ROWS_USED, m.KV_ROWS_TOTAL, m.KV_TOKENS_USED, m.KV_TOKENS_TOTAL)
            for gauge, value, last in zip(gauges, kv, self._kv or (None,) * 4):
                if value != last:  # each set is a locked write to a shared file: only the values that moved
                    gauge.set(value)
            self._kv = kv
            if waiting and step.kv_rows >= step.kv_rows_total:
                m.KV_FULL_STEPS.inc()
        for phase, splits in step.oom_splits.items():
            m.OOM.labels(phase=phase).inc(splits)
        if step.prefix is not None:
            self._count_prefix(step.prefix)
        m.REQUESTS_RUNNING.set(running)
        m.REQUESTS_WAITING.set(waiting)
        wall = time.monotonic()
        decoded = step.decoded_rows if step.decode_s is not None else 0
        self._tokens.append((wall, decoded))
        self._tokens_in_window += decoded
        while self._tokens and self._tokens[0][0] < wall - self.window_s:
            self._tokens_in_window -= self._tokens.popleft()[1]
        span = wall - self._tokens[0][0] if len(self._tokens) > 1 else self.window_s
        m.TOKENS_PER_SECOND.set(self._tokens_in_window / max(span, 1e-3))
        if wall - self._last_resources >= self.resource_every_s:
            self._last_resources = wall
            m.update_resource_gauges()

    def on_idle(self, waiting: int, now: float) -> None:
        self.metrics.KV_ROWS_USED.set(0)
        self.metrics.KV_TOKENS_USED.set(0)
        self._kv = None
        self.metrics.REQUESTS_RUNNING.set(0)
        self.metrics.REQUESTS_WAITING.set(waiting)
        self.metrics.TOKENS_PER_SECOND.set(0)
        self._tokens.clear()
        self._tokens_in_window = 0


class StepLog(StepObserver):
    """At debug level, one ``engine_step`` line every ``every`` steps: rows, prefill tokens, decode
    rows, KV rows, step milliseconds, running and waiting. Sampled, because a step takes
    milliseconds and a line per step would be the log's main cost; silent (one level check per
    step) unless ``AIENG_LOG_LEVEL=debug``."""

    def __init__(self, every: int = 50, *, version: str = ""):
        from aieng.observability.logs import log_event

        self.log_event = log_event
        self.log = logging.getLogger("aieng.engine.steps")
        self.every = max(1, every)
        self.version = version
        self.steps = 0

    def on_step(self, step, running: int, waiting: int, now: float) -> None:
        self.steps += 1
        if self.steps % self.every or not self.log.isEnabledFor(logging.DEBUG):
            return
        self.log_event(
            self.log,
            "engine_step",
            level=logging.DEBUG,
            step=self.steps,
            version=self.version,
            prefill_tokens=step.prefill_tokens,
            decode_rows=step.decoded_rows,
            kv_rows=step.kv_rows,
            kv_rows_total=step.kv_rows_total,
            step_ms=round(((step.prefill_s or 0.0) + (step.decode_s or 0.0)) * 1000, 3),
            running=running,
            waiting=waiting,
        )
