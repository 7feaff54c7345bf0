"""Between the event loop and the engine thread: submit a request, receive its events.

Tokenization and validation run in a worker thread (``asyncio.to_thread``) so the event loop
never does model-side work. Events come back through ``loop.call_soon_threadsafe`` into an
``asyncio.Queue`` per request. Leaving the ``events`` iterator early — the client disconnected,
the handler was cancelled — cancels the request, so its row leaves the batch before the next
decode step.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aieng.engine import GenerationRequest, SamplingParams, TokenEvent
from aieng.scheduler import EngineLoop


@dataclass
class Submission:
    request_id: str
    prompt_tokens: int
    queue: asyncio.Queue


class Bridge:
    def __init__(self, engine_loop: EngineLoop, engine):
        self.engine_loop = engine_loop
        self.engine = engine

    async def prepare(self, prompt_ids: list[int] | None, prompt_text: str | None, params: SamplingParams,
                      request_id: str | None = None) -> GenerationRequest:
        """Tokenize (off the event loop) and validate; raises InvalidRequestError (400)."""
        def build() -> GenerationRequest:
            ids = prompt_ids if prompt_ids is not None else self.engine.encode(prompt_text)
            request = GenerationRequest(request_id or uuid.uuid4().hex, ids, params)
            self.engine.check(request)
            return request

        return await asyncio.to_thread(build)

    def submit(self, request: GenerationRequest, *, priority: str, timeout: float | None) -> Submission:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def sink(event: TokenEvent) -> None:  # engine thread
            loop.call_soon_threadsafe(queue.put_nowait, event)

        self.engine_loop.submit(request, sink, priority=priority, timeout=timeout)
        return Submission(request.request_id, len(request.prompt_ids), queue)

    async def events(self, submission: Submission) -> AsyncIterator[TokenEvent]:
        finished = False
        try:
            while True:
                event = await submission.queue.get()
                yield event
                if event.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.engine_loop.cancel(submission.request_id)

    async def collect(self, submission: Submission, receive) -> tuple[str, TokenEvent | None]:
        """Wait for the whole result; returns (text, final event) or (partial, None) if the client left.

        ``receive`` is the ASGI receive callable: once the body is read, its next message is
        ``http.disconnect`` — so awaiting it beside the result notices a client that gave up.
        """
        parts: list[str] = []

        async def gather() -> TokenEvent:
            async for event in self.events(submission):
                parts.append(event.text)
                if event.finished:
                    return event

        result_task = asyncio.ensure_future(gather())
        disconnect_task = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({result_task, disconnect_task}, return_when=asyncio.FIRST_COMPLETED)
            if result_task in done:
                return "".join(parts), result_task.result()
            result_task.cancel()  # the events iterator's finally cancels the row
            try:
                await result_task
            except asyncio.CancelledError:
                pass
            return "".join(parts), None
        finally:
            disconnect_task.cancel()


async def _wait_disconnect(receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
