"""A worker's heartbeat while it starts, so a long model load is not mistaken for a hung worker.

gunicorn's master kills a worker whose heartbeat file has not been touched for ``timeout``
seconds (``AIENG_WORKER_TIMEOUT_S``), starting or not. Uvicorn's worker touches it from its main
loop, which begins only after the app's startup; on CUDA the weights are verified and loaded in
that startup (the master never touches CUDA), so a model that takes longer than the timeout to
load would be killed and replaced, again and again, and never serve. While the start runs
(``runtime.start`` on its own thread) this beats on the event loop instead, up to
``AIENG_WORKER_START_TIMEOUT_S``; past that it stops, says so, and gunicorn's timeout ends a start
that really hangs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def beat_while_starting(
    notify: Callable[[], None],
    started: Callable[[], bool],
    *,
    interval_s: float,
    limit_s: float,
    on_limit: Callable[[], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable] = asyncio.sleep,
) -> str:
    """Call ``notify`` every ``interval_s`` until ``started()``; returns "started", or "limit"
    after calling ``on_limit`` once ``limit_s`` have passed without it."""
    deadline = clock() + limit_s
    while not started():
        if clock() >= deadline:
            on_limit()
            return "limit"
        notify()
        await sleep(interval_s)
    return "started"


MAX_BEAT_S = 10.0  # the longest gap between beats, whatever the timeout


def beat_interval(worker_timeout_s: float) -> float:
    """Often enough that one late tick never costs the worker: a quarter of the timeout, capped at
    ``MAX_BEAT_S`` so that a long timeout still sees a steady pulse."""
    return max(0.1, min(MAX_BEAT_S, worker_timeout_s / 4))
