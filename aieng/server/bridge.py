"""Between the event loop and the engine thread: submit a request, receive its events.

Tokenization and validation run in a worker thread (``asyncio.to_thread``) so the event loop
never does model-side work. Events come back through a per-loop mailbox (one
``call_soon_threadsafe`` per batch of events) into an ``asyncio.Queue`` per request. Leaving the ``events`` iterator early — the client disconnected,
the handler was cancelled — cancels the request, so its row leaves the batch before the next
decode step.

Per-request metrics are recorded here, on the event loop, closest to what the client sees:
time to first token, inter-token latency, and the final counters.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import weakref
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aieng import metrics
from aieng.engine import GenerationRequest, SamplingParams, TokenEvent
from aieng.observability import tracing
from aieng.observability.logs import log_event
from aieng.scheduler import EngineLoop
from aieng.scheduler.policy import QueuedRequest

log = logging.getLogger("aieng.request")

#: Inter-token latencies are flushed to the histogram every this many tokens and at the end, so a
#: long generation still shows up in a scrape while it runs.
ITL_FLUSH_EVERY = 16


@dataclass
class Submission:
    request: GenerationRequest
    queued: QueuedRequest
    queue: asyncio.Queue
    submitted: float = field(default_factory=time.perf_counter)
    final: TokenEvent | None = None
    text_parts: list[str] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.request.request_id


class Bridge:
    def __init__(self, engine_loop: EngineLoop, engine, *, metrics_enabled: bool = True, payload_sample: float = 0.0):
        self.engine_loop = engine_loop
        self.engine = engine
        self.metrics_enabled = metrics_enabled
        self.payload_sample = payload_sample
        self._mailboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> _Mailbox

    async def prepare(self, prompt_ids: list[int] | None, prompt_text: str | None,
                      params: SamplingParams) -> GenerationRequest:
        """Tokenize (off the event loop) and validate; raises InvalidRequestError (400)."""
        context = tracing.current.get()

        def build() -> GenerationRequest:
            ids = prompt_ids if prompt_ids is not None else self.engine.encode(prompt_text)
            request = GenerationRequest(uuid.uuid4().hex, ids, params, trace_id=context.trace_id if context else None)
            self.engine.check(request)
            return request

        return await asyncio.to_thread(build)

    def submit(self, request: GenerationRequest, *, priority: str, timeout: float | None) -> Submission:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = _Mailbox(loop)

        def sink(event: TokenEvent) -> None:  # engine thread
            mailbox.post(queue, event)

        queued = self.engine_loop.submit(request, sink, priority=priority, timeout=timeout)
        return Submission(request, queued, queue)

    async def events(self, submission: Submission) -> AsyncIterator[TokenEvent]:
        previous = None
        gaps: list[float] = []  # inter-token latencies, recorded in bulk (see metrics.observe_many)
        try:
            while True:
                event = await submission.queue.get()
                now = time.perf_counter()
                if self.metrics_enabled and event.token_id is not None:
                    if previous is None:
                        metrics.TIME_TO_FIRST_TOKEN.labels(priority=submission.queued.priority).observe(
                            now - submission.submitted)
                    else:
                        gaps.append(now - previous)
                        if len(gaps) >= ITL_FLUSH_EVERY:
                            metrics.observe_many(metrics.INTER_TOKEN_LATENCY, gaps)
                            gaps = []
                previous = now
                submission.text_parts.append(event.text)
                if event.finished:
                    submission.final = event
                    if self.metrics_enabled:
                        metrics.record_finished(event, max_tokens=submission.request.params.max_tokens)
                yield event
                if event.finished:
                    return
        finally:
            if gaps:
                metrics.observe_many(metrics.INTER_TOKEN_LATENCY, gaps)
            if submission.final is None:
                self.engine_loop.cancel(submission.request_id)

    async def collect(self, submission: Submission, receive) -> TokenEvent | None:
        """Wait for the whole result; None if the client went away first (the row is cancelled).

        ``receive`` is the ASGI receive callable: once the body is read, its next message is
        ``http.disconnect`` — so awaiting it beside the result notices a client that gave up.
        """
        async def gather() -> TokenEvent:
            async for event in self.events(submission):
                if event.finished:
                    return event

        result_task = asyncio.ensure_future(gather())
        disconnect_task = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({result_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
            if result_task in done:
                return result_task.result()
            result_task.cancel()  # the events iterator's finally cancels the row
            try:
                await result_task
            except asyncio.CancelledError:
                pass
            return None
        finally:
            disconnect_task.cancel()

    def log_finished(self, submission: Submission, *, route: str, prompt: str | None = None) -> None:
        """The one log line per request: timings, tokens, finish reason or error code."""
        q, final = submission.queued, submission.final
        fields = {"route": route, "priority": q.priority, "prompt_tokens": len(submission.request.prompt_ids),
                  "total_s": round(time.perf_counter() - submission.submitted, 4)}
        if q.admitted_at is not None:
            fields["queue_s"] = round(q.admitted_at - q.arrival, 4)
        if q.prefill_s is not None:
            fields["prefill_s"] = round(q.prefill_s, 4)
        if q.first_token_at is not None and q.finished_at is not None:
            fields["decode_s"] = round(q.finished_at - q.first_token_at, 4)
        if final is None:
            fields["outcome"] = "client_disconnected"
        elif final.error is not None:
            fields.update(outcome="error", error_code=final.error.code)
        else:
            fields.update(outcome="finished", finish_reason=final.finish_reason, finish_cause=final.finish_cause,
                          completion_tokens=final.completion_tokens)
        if self.payload_sample and random.random() < self.payload_sample:
            fields.update(prompt=prompt, output="".join(submission.text_parts))
        level = logging.WARNING if final is None or final.error is not None else logging.INFO
        log_event(log, "request_finished", level=level, **fields)


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


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
