"""Per-request metrics as the client sees them, recorded on the event loop as tokens arrive.

Time to first token counts from submission to the first token reaching the event loop; the
inter-token latencies are the gaps between tokens there. Both are closer to what a client sees
than anything the engine thread could measure. Inter-token latencies are flushed to the histogram
in bulk (``metrics.observe_many``) every ``ITL_FLUSH_EVERY`` tokens and at the end, so a long
generation still shows up in a scrape while it runs.
"""

from __future__ import annotations

from aieng.engine import TokenEvent
from aieng.observability import metrics

ITL_FLUSH_EVERY = 16


class ClientMetrics:
    def __init__(self, *, priority: str, max_tokens: int, submitted: float, version: str = "", enabled: bool = True):
        self.priority = priority
        self.version = version  # the version whose engine serves the request
        self.max_tokens = max_tokens
        self.submitted = submitted  # perf_counter seconds
        self.enabled = enabled
        self._previous: float | None = None
        self._gaps: list[float] = []

    def on_event(self, event: TokenEvent, now: float) -> None:
        if not self.enabled:
            return
        if event.token_id is not None and event.index == 0:  # with n > 1, the first choice's pace is the stream's
            if self._previous is None:
                ttft = now - self.submitted
                metrics.TIME_TO_FIRST_TOKEN.labels(priority=self.priority, version=self.version).observe(ttft)
            else:
                self._gaps.append(now - self._previous)
                if len(self._gaps) >= ITL_FLUSH_EVERY:
                    self.flush()
            self._previous = now
        if event.finished:
            metrics.record_finished(event, max_tokens=self.max_tokens, version=self.version)

    def aborted(self, stats) -> None:
        """The client left before the end (``stats``: the scheduler's ``RequestStats``): counted by
        the phase the request was in, as far as the client got: no token yet, admitted or not, or decoding."""
        if self.enabled:
            phase = "queued" if stats.admitted_at is None else "prefill" if self._previous is None else "decode"
            metrics.count_abort(phase, self.version)

    def flush(self) -> None:
        if self._gaps:
            metrics.observe_many(metrics.INTER_TOKEN_LATENCY.labels(version=self.version), self._gaps)
            self._gaps = []
