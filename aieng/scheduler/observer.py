"""Scheduler and engine metrics, fed by the engine loop after each step (on the engine thread)."""

from __future__ import annotations

import collections
import time

from aieng import metrics


class MetricsObserver:
    def __init__(self, window_s: float = 5.0, resource_every_s: float = 1.0):
        self.window_s = window_s
        self.resource_every_s = resource_every_s
        self._last_resources = 0.0
        self._tokens: collections.deque = collections.deque()  # (time, tokens decoded)
        self._tokens_in_window = 0  # running sum of the deque: summing ~1000 entries every step cost more than the rest

    def on_admit(self, queued, now: float) -> None:
        metrics.QUEUE_WAIT.labels(priority=queued.priority).observe(max(0.0, now - queued.arrival))

    def on_step(self, engine, running: int, waiting: int) -> None:
        prefill_s, decode_s, rows = engine.last_timings
        if prefill_s is not None:
            metrics.PREFILL_SECONDS.observe(prefill_s)
        if decode_s is not None:
            metrics.DECODE_STEP_SECONDS.observe(decode_s)
            metrics.BATCH_SIZE.observe(rows)
        metrics.REQUESTS_RUNNING.set(running)
        metrics.REQUESTS_WAITING.set(waiting)
        now = time.monotonic()
        decoded = rows if decode_s is not None else 0
        self._tokens.append((now, decoded))
        self._tokens_in_window += decoded
        while self._tokens and self._tokens[0][0] < now - self.window_s:
            self._tokens_in_window -= self._tokens.popleft()[1]
        span = now - self._tokens[0][0] if len(self._tokens) > 1 else self.window_s
        metrics.TOKENS_PER_SECOND.set(self._tokens_in_window / max(span, 1e-3))
        if now - self._last_resources >= self.resource_every_s:
            self._last_resources = now
            metrics.update_resource_gauges()

    def on_idle(self, waiting: int) -> None:
        metrics.REQUESTS_RUNNING.set(0)
        metrics.REQUESTS_WAITING.set(waiting)
        metrics.TOKENS_PER_SECOND.set(0)
        self._tokens.clear()
        self._tokens_in_window = 0
