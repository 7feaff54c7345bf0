"""Between the event loop and the engine thread: submit a request, receive its events.

Events come back through a per-loop mailbox (one ``call_soon_threadsafe`` per batch of events)
into an ``asyncio.Queue`` per request. Leaving the ``events`` iterator early (the client
disconnected, the handler was cancelled) cancels the request, so its row leaves the batch
before the next decode step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aieng.engine import GenerationRequest, TokenEvent
from aieng.engine.request import error_event
from aieng.engine.sampling import TokenLogprobs
from aieng.errors import AiengError
from aieng.scheduler import QueuedRequest, Scheduler
from aieng.server.http.client_metrics import ClientMetrics

log = logging.getLogger("aieng.server")


@dataclass
class Submission:
    """One request on the HTTP side: its queue of events, what it produced, its client metrics."""

    request: GenerationRequest
    queued: QueuedRequest  # the scheduler's record: priority, and ``stats`` once it is over
    queue: asyncio.Queue
    metrics: ClientMetrics
    submitted: float = field(default_factory=time.perf_counter)
    final: TokenEvent | None = None
    texts: dict[int, list[str]] = field(default_factory=dict)  # choice index -> its text, piece by piece
    logprobs: dict[int, list[TokenLogprobs]] = field(default_factory=dict)  # when the request asked for them
    finishes: dict[int, str] = field(default_factory=dict)  # choice index -> its finish reason
    token_ids: dict[int, list[int]] = field(default_factory=dict)  # choice index -> the ids it generated
    prompt_logprobs: tuple | None = None  # echo + logprobs: each prompt token's (None for the first)

    @property
    def text_parts(self) -> list[str]:
        """The first choice's text (the only one unless n > 1)."""
        return self.texts.get(0, [])

    @property
    def request_id(self) -> str:
        return self.request.request_id


class StreamBufferFullError(AiengError):
    """A client read its stream so slowly that the tokens waiting for it passed the bound."""

    code = "client_too_slow"
    status = 408
    type = "invalid_request_error"
    request_path = True


class EventQueue(asyncio.Queue):
    """A request's events waiting for its handler, at most ``limit`` of them.

    The engine never waits for a socket: a client that reads slowly only makes this queue grow
    (once the kernel's and uvicorn's write buffers are full). Past ``limit`` events the request
    is cancelled (its row leaves the batch), the overflow is logged, and the handler, whenever
    it gets there, ends the stream with a ``client_too_slow`` error."""

    def __init__(self, limit: int, on_overflow):
        super().__init__()
        self.limit = limit
        self.on_overflow = on_overflow
        self.overflowed = False

    def put_nowait(self, event: TokenEvent) -> None:
        if self.overflowed:
            return  # the request is over; what the engine produced before the cancel landed is dropped
        if self.limit and self.qsize() >= self.limit and not event.finished:
            self.overflowed = True
            error = self.on_overflow()
            super().put_nowait(error_event(event.request_id, error))
            return
        super().put_nowait(event)


class Bridge:
    def __init__(
        self, scheduler: Scheduler, *, metrics_enabled: bool = True, version: str = "", buffer_events: int = 0
    ):
        self.scheduler = scheduler
        self.version = version  # the label of this version's request metrics
        self.metrics_enabled = metrics_enabled
        self.buffer_events = buffer_events  # EventQueue's limit (AIENG_STREAM_BUFFER_EVENTS); 0 = none
        self._mailboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> _Mailbox

    def submit(self, request: GenerationRequest, *, priority: str, timeout: float | None) -> Submission:
        """Queue ``request`` (raises OverloadedError or NotReadyError); read it with ``events``."""
        loop = asyncio.get_running_loop()

        def overflow() -> AiengError:
            log.warning(
                "a client reads its stream too slowly: %d tokens wait for it; cancelling the request",
                self.buffer_events,
                extra={"event": "slow_client", "phase": "stream", "trace_id": request.trace_id},
            )
            self.scheduler.cancel(request.request_id)
            return StreamBufferFullError(
                f"the client read its stream too slowly: {self.buffer_events} tokens were "
                "waiting for it (AIENG_STREAM_BUFFER_EVENTS); the request was cancelled"
            )

        queue = EventQueue(self.buffer_events, overflow)
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = _Mailbox(loop)

        def sink(event: TokenEvent) -> None:  # engine thread
            mailbox.post(queue, event)

        submitted = time.perf_counter()
        queued = self.scheduler.submit(request, sink, priority=priority, timeout=timeout)
        metrics = ClientMetrics(
            priority=priority,
            max_tokens=request.params.max_tokens,
            submitted=submitted,
            version=self.version,
            enabled=self.metrics_enabled,
        )
        return Submission(request, queued, queue, metrics, submitted=submitted)

    async def events(self, submission: Submission) -> AsyncIterator[TokenEvent]:
        """The request's events up to the finishing one; leaving early cancels the request."""
        try:
            while True:
                event = await submission.queue.get()
                submission.metrics.on_event(event, time.perf_counter())
                submission.texts.setdefault(event.index, []).append(event.text)
                if event.token_id is not None:
                    submission.token_ids.setdefault(event.index, []).append(event.token_id)
                if event.logprobs is not None:
                    submission.logprobs.setdefault(event.index, []).append(event.logprobs)
                if event.prompt_logprobs is not None:
                    submission.prompt_logprobs = event.prompt_logprobs
                if event.choice_finish is not None:
                    submission.finishes[event.index] = event.choice_finish
                if event.finished:
                    submission.final = event
                yield event
                if event.finished:
                    return
        finally:
            submission.metrics.flush()
            if submission.final is None:
                self.scheduler.cancel(submission.request_id)
                submission.metrics.aborted(submission.queued.stats)

    async def result(self, submission: Submission) -> TokenEvent:
        """Wait for the finishing event (cancel the awaiting task to abandon the request)."""
        async for event in self.events(submission):
            if event.finished:
                return event
        raise RuntimeError("the event stream ended without a finishing event")


class _Mailbox:
    """Events from the engine thread to one event loop, one wake-up per batch of events.

    A decode step of 32 rows produces 32 events; waking the loop once for each (a self-pipe write
    and a GIL hand-off apiece) was a large share of the server's per-token cost. ``post`` appends
    under a lock and schedules a drain only when none is pending, so a whole step's events reach
    their queues in one loop callback, in the order they were produced.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lock = threading.Lock()
        self.pending: list[tuple[asyncio.Queue, TokenEvent]] = []
        self.scheduled = False

    def post(self, queue: asyncio.Queue, event: TokenEvent) -> None:
        with self.lock:
            self.pending.append((queue, event))
            if self.scheduled:
                return
            self.scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is left to read these events
            with self.lock:
                self.pending.clear()
                self.scheduled = False

    def _drain(self) -> None:
        with self.lock:
            items, self.pending, self.scheduled = self.pending, [], False
        for queue, event in items:
            queue.put_nowait(event)
