"""Who joins the running batch next: priorities with aging, length buckets, a token budget.

Pure logic over a clock value passed in, so it is tested with hand-made requests and no model
(the way vLLM tests its scheduler).

- **Priority with aging.** A request's rank is its class (``interactive`` 0, ``batch`` 1) minus
  the time it has waited divided by ``aging_ms``. A ``batch`` request therefore overtakes newly
  arriving ``interactive`` ones after waiting ``aging_ms``: under constant interactive load it
  still starts within about ``aging_ms`` plus one step (tested).
- **Buckets.** Prefill pads every prompt of a group to the longest one. The head of the queue
  picks a length bucket and only requests of that bucket join it in this step; others join on
  the next step (one decode step later) instead of inflating the padding.
- **Budget.** A step prefills at most ``max_batch_tokens`` padded prompt tokens (the head always
  goes, so a long prompt cannot starve), and the batch never exceeds ``max_batch_size`` rows.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from aieng.engine.request import GenerationRequest
from aieng.scheduler.stats import RequestStats
from aieng.settings import DEFAULTS

PRIORITIES = {"interactive": 0, "batch": 1}


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = DEFAULTS.max_batch_size  # rows decoded together
    max_batch_tokens: int = DEFAULTS.max_batch_tokens  # padded prompt tokens prefilled in one step
    max_queue: int = DEFAULTS.max_queue  # waiting requests; beyond it submit fails with 429
    max_queue_delay_ms: float = DEFAULTS.max_queue_delay_ms  # an idle engine waits this long for companions
    aging_ms: float = 2000.0  # waiting this long lifts a request by one priority class (no setting)
    default_timeout_s: float = DEFAULTS.request_timeout_s  # deadline of a request that sets no `timeout`
    bucket_edges: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

    def bucket(self, prompt_tokens: int) -> int:
        return bisect.bisect_left(self.bucket_edges, prompt_tokens)


@dataclass
class QueuedRequest:
    """A request in the scheduler's hands, waiting or running: the scheduler's record of it."""

    request: GenerationRequest
    priority: str = "interactive"
    arrival: float = 0.0  # clock seconds
    deadline: float | None = None  # clock seconds
    seq: int = 0  # arrival order, the final tie-break
    sink: object = field(default=None, repr=False)  # where this request's events are delivered
    stats: RequestStats = field(default=None)  # type: ignore[assignment]  # set from ``arrival`` when None

    def __post_init__(self):
        if self.stats is None:
            self.stats = RequestStats(arrival=self.arrival)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def rows(self) -> int:
        """Batch rows the request holds once running: one per choice (``n``)."""
        return self.request.params.n

    def rank(self, now: float, aging_ms: float) -> float:
        waited_ms = (now - self.arrival) * 1000.0
        return PRIORITIES[self.priority] - waited_ms / aging_ms


class QueueFullError(Exception):
    pass


class WaitingQueue:
    """The bounded queue of requests not yet in the running batch."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self._items: dict[str, QueuedRequest] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._items

    def add(self, item: QueuedRequest) -> None:
        if len(self._items) >= self.config.max_queue:
            raise QueueFullError(f"the queue is full ({self.config.max_queue} waiting requests)")
        if item.priority not in PRIORITIES:
            raise ValueError(f"unknown priority {item.priority!r}")
        self._seq += 1
        item.seq = self._seq
        self._items[item.request_id] = item

    def remove(self, request_id: str) -> QueuedRequest | None:
        return self._items.pop(request_id, None)

    def expired(self, now: float) -> list[QueuedRequest]:
        gone = [q for q in self._items.values() if q.deadline is not None and q.deadline <= now]
        for q in gone:
            del self._items[q.request_id]
        return gone

    def oldest_arrival(self) -> float | None:
        return min((q.arrival for q in self._items.values()), default=None)

    def ordered(self, now: float) -> list[QueuedRequest]:
        return sorted(self._items.values(), key=lambda q: (q.rank(now, self.config.aging_ms), q.seq))

    def pop_joiners(self, now: float, free_slots: int) -> list[QueuedRequest]:
        """Remove and return the group to prefill this step (possibly empty). ``free_slots`` counts
        rows: a request with ``n`` choices takes ``n``, and the head waits until its rows are free."""
        if free_slots <= 0 or not self._items:
            return []
        ordered = self.ordered(now)
        head = ordered[0]
        if head.rows > free_slots:
            return []
        bucket = self.config.bucket(head.prompt_tokens)
        group = [head]
        longest, used = head.prompt_tokens, head.rows
        for candidate in ordered[1:]:
            if used + candidate.rows > free_slots:
                break
            if self.config.bucket(candidate.prompt_tokens) != bucket:
                continue
            padded = max(longest, candidate.prompt_tokens) * (len(group) + 1)
            if padded > self.config.max_batch_tokens:
                break
            group.append(candidate)
            longest, used = max(longest, candidate.prompt_tokens), used + candidate.rows
        for q in group:
            del self._items[q.request_id]
        return group
