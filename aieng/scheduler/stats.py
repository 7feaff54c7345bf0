"""The timings of one request, kept by the scheduler (their only owner) for the request's log line.

All values are scheduler-clock seconds (``time.monotonic`` in the server). The scheduler writes
them as the request moves: admitted (joins the batch), prefilled, first token, finished. The
HTTP side reads them once the request is over.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RequestStats:
    arrival: float
    admitted_at: float | None = None  # joined the running batch
    prefill_s: float | None = None  # duration of the prefill it was part of
    first_token_at: float | None = None
    finished_at: float | None = None

    def log_fields(self) -> dict[str, float]:
        """``queue_s``, ``prefill_s``, ``decode_s``: those that happened, rounded for a log line."""
        fields = {}
        if self.admitted_at is not None:
            fields["queue_s"] = round(self.admitted_at - self.arrival, 4)
        if self.prefill_s is not None:
            fields["prefill_s"] = round(self.prefill_s, 4)
        if self.first_token_at is not None and self.finished_at is not None:
            fields["decode_s"] = round(self.finished_at - self.first_token_at, 4)
        return fields

    def server_timing(self) -> str:
        """The phases as a ``Server-Timing`` value (milliseconds): ``queue;dur=1.2, prefill;dur=…``.

        Sent as a header on a whole generation reply; a stream's headers leave before its first
        token, so its phases are only in the ``request_finished`` log line."""
        return ", ".join(
            f"{name.removesuffix('_s')};dur={value * 1000:.1f}" for name, value in self.log_fields().items()
        )
