"""Model work off the engine thread runs on a thread that ends when the work is done.

Why: PyTorch's CPU kernels run their parallel regions on OpenMP (libgomp on Linux), and libgomp
keeps a pool of worker threads for every thread that ever ran a parallel region, for as long as
that thread lives. Once a process holds more such threads than it has cores, libgomp stops
letting idle pool threads spin between regions: they sleep, and every region then waits for a
wake-up. A decode step runs hundreds of short regions (a few per layer), so a second long-lived
pool beside the engine's slows every step: on the ``smollm2-135m`` shape, a few idle helper
threads that had once run a matrix multiply cut batch-1 decode by about half. The server had two
such pools, from building the engine on the event loop's executor thread and from hot swaps on
the watcher's thread, and its steps were far slower than the same engine's alone (``aieng bench
serve`` measures the one, ``aieng bench engine`` the other). A thread that exits takes its pool
with it.

So: start-up (weight-format measurement, engine build, warm-up) and hot swaps (load, warm-up,
canaries) run through ``run_on_own_thread``; the engine thread is the only long-lived thread of
a worker that runs torch kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_on_own_thread(fn: Callable[..., T], *args, name: str, **kwargs) -> T:
    """Call ``fn(*args, **kwargs)`` on a new thread named ``name``, wait for it to end, and
    return its result or raise its exception (with its own traceback)."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which decides
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]
