"""Hot swap: switch a running worker to the store's ``current`` version without a restart and
without failing a request.

The steps, each of which leaves the old version serving if it fails:

1. **verify and load** the new version beside the old (``load_version`` re-hashes every file,
   refuses remote code, checks the memory budget);
2. **warm it up** on this thread while the old one keeps serving. Same architecture: the new
   engine takes the serving engine's weight-format plan and compiled graphs
   (``Engine(..., replacing=serving engine)``; weights are graph inputs, not constants), so
   nothing is measured, traced or compiled: 0.2 s per swap on an idle demo server, under 1 s
   under 16 streams, instead of 5-11 s of compiling beside the serving engine;
3. **switch**: one reference assignment (``runtime.serving``); new requests read the new version,
   in-flight ones finish on the old;
4. **retire** the old: stop admitting, wait for its in-flight requests, stop its engine thread,
   drop the references so its weights and KV cache are freed.

Memory during a swap is the two versions' weights plus both engines' KV caches, for as long as
the old one has requests in flight; afterwards one of each.

**Several workers end on the same version** because none of them is told a version: each
converges on the store's ``current`` link, which ``promote``/``rollback`` replace atomically.
Every worker checks it every ``AIENG_RELOAD_POLL_S`` (a ``readlink``), and ``POST
/admin/reload`` makes the worker that receives it check at once and answer when done. A worker
whose load fails keeps its old version, counts and logs the failure, shows it in
``/health/ready``, and does not retry that version until ``current`` changes or an admin reload
asks again. ``aieng model promote --reload`` verifies the outcome from ``/metrics``, where
``aieng_model_info`` has one sample per live worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import logging
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from aieng.engine import Engine
from aieng.errors import AiengError
from aieng.loading.loader import LoadConfig, load_version
from aieng.observability import metrics
from aieng.observability.logs import set_service
from aieng.server.process.serving import Serving
from aieng.store import ModelRef, ModelStore

log = logging.getLogger("aieng.server.swap")


@contextlib.contextmanager
def _host_swap_lock(store, name: str, *, blocking: bool):
    """One worker of a host swaps at a time: loading and warming up a version takes a core, and
    the workers that are not swapping keep the service's capacity meanwhile. Yields whether the
    lock is held; a lock file that cannot be created (read-only temp) means no coordination."""
    key = hashlib.sha256(f"{Path(store).resolve()}:{name}".encode()).hexdigest()[:16]
    try:
        handle = open(Path(tempfile.gettempdir()) / f"aieng-swap-{key}.lock", "a")
    except OSError:
        yield True
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclass
class SwapOutcome:
    status: str  # swapped | unchanged | failed | busy
    previous: str | None
    version: str | None
    seconds: float = 0.0
    error: str | None = None
    at: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class HotSwapper:
    def __init__(self, runtime):
        self.runtime = runtime
        self._lock = threading.Lock()  # one swap at a time per worker
        self.last: SwapOutcome | None = None  # shown in /health/ready
        self._failed_target: str | None = None  # not retried by the poller until `current` moves on
        self._stop = threading.Event()

    @property
    def pinned(self) -> bool:
        return self.runtime.ref.version is not None  # AIENG_MODEL=N@V serves V, whatever `current` says

    def target(self) -> str | None:
        return ModelStore(self.runtime.settings.store).current(self.runtime.ref.name)

    def check(self, *, forced: bool = False) -> SwapOutcome:
        """Swap to ``current`` if it differs from what is served. ``forced`` (an admin reload)
        also retries a version that failed before."""
        runtime = self.runtime
        serving = runtime.serving
        if serving is None or not runtime.ready:
            return SwapOutcome("busy", None, None, error="the worker is still starting")
        target = None if self.pinned else self.target()
        if target is None or target == serving.version:
            return SwapOutcome("unchanged", serving.version, serving.version)
        if target == self._failed_target and not forced:
            return self.last
        if not self._lock.acquire(blocking=forced):
            return SwapOutcome("busy", serving.version, target, error="a swap is already running")
        try:
            with _host_swap_lock(runtime.settings.store, runtime.ref.name, blocking=forced) as held:
                if not held:  # another worker of this host is swapping: the next poll tries again
                    return SwapOutcome("busy", serving.version, target, error="another worker is swapping")
                if runtime.serving.version == target:  # another caller swapped while we waited for the lock
                    return SwapOutcome("unchanged", target, target)
                return self._swap(target)
        finally:
            self._lock.release()

    def _swap(self, version: str) -> SwapOutcome:
        runtime = self.runtime
        old = runtime.serving
        previous = old.version
        started = time.perf_counter()
        log.info("hot swap %s@%s -> %s: verifying and loading beside the serving version", old.name, old.version,
                 version, extra={"event": "swap_started", "from": old.version, "to": version})
        try:
            new = self._load_and_warm(version)
        except Exception as exc:  # the old version keeps serving
            message = exc.message if isinstance(exc, AiengError) else f"{type(exc).__name__}: {exc}"
            self._failed_target = version
            metrics.MODEL_SWAPS.labels(outcome="failed").inc()
            log.error("hot swap to %s@%s failed; still serving %s: %s", old.name, version, old.version, message,
                      extra={"event": "swap_failed", "from": old.version, "to": version})
            self.last = SwapOutcome("failed", old.version, version, time.perf_counter() - started, message, time.time())
            return self.last
        new.engine_loop.start()
        runtime.install(new)  # from here new requests go to the new version
        new.publish(True)
        old.publish(False)
        set_service(new.name, new.version)
        self._failed_target = None
        switched = time.perf_counter() - started
        log.info("hot swap %s@%s -> %s: switched after %.1f s; the old version finishes %d request(s) in flight",
                 old.name, old.version, version, switched, old.in_flight,
                 extra={"event": "swap_switched", "from": old.version, "to": version, "seconds": round(switched, 2)})
        drained = old.retire(timeout_s=runtime.settings.request_timeout_s)
        del old
        collected = time.perf_counter()
        gc.collect()
        collected = time.perf_counter() - collected
        metrics.MODEL_SWAPS.labels(outcome="ok").inc()
        self.last = SwapOutcome("swapped", previous, version, switched, None, time.time())
        log.info("hot swap to %s done (old version retired, %s; collecting it took %.3f s)", version,
                 "nothing left in flight" if drained else "timed out waiting for in-flight requests", collected,
                 extra={"event": "swap_done", "to": version, "gc_s": round(collected, 3)})
        return self.last

    def _load_and_warm(self, version: str) -> Serving:
        runtime = self.runtime
        ref = ModelRef(runtime.ref.name, version)
        loaded = load_version(ModelStore(runtime.settings.store), ref, LoadConfig.from_settings(runtime.settings))
        engine = Engine(loaded.model, loaded.tokenizer, context_length=loaded.context_length,
                        config=runtime.config.engine, replacing=runtime.serving.engine)
        shared = engine.shared_graphs  # same architecture: nothing measured or compiled
        log.info("hot swap to %s: warming up (%s)", version, "graphs shared with the serving version" if shared
                 else "new graphs", extra={"event": "swap_warmup", "to": version, "shared_graphs": shared})
        engine.warmup()
        if engine.compile_status == "compiling":
            engine.wait_for_compile()  # a swap switches to a fully warm version only
        return Serving.build(ref.name, loaded, engine, runtime.config.scheduler, metrics_enabled=runtime.settings.metrics)

    # -- polling -------------------------------------------------------------------------------
    def watch(self) -> None:
        """Start the thread that follows ``current`` (not for a pinned N@V, nor with a zero poll)."""
        poll = self.runtime.settings.reload_poll_s
        if self.pinned or poll <= 0:
            return
        threading.Thread(target=self._poll, args=(poll,), name="aieng-swap-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _poll(self, poll: float) -> None:
        while not self._stop.wait(poll):
            try:
                self.check()
            except Exception:  # never let the watcher die: the next poll tries again
                log.exception("checking the store for a new current version failed")
