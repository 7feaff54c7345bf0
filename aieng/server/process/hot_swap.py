"""Hot swap: switch a running worker to the store's ``current`` version without a restart and
without failing a request.

The steps, each of which leaves the old version serving if it fails:

1. **verify and load** the new version beside the old (``load_version`` re-hashes every file,
   refuses remote code, checks the memory budget);
2. **warm it up** on this thread while the old one keeps serving. Same architecture: the new
   engine takes the serving engine's weight-format plan and compiled graphs
   (``Engine(..., replacing=serving engine)``; weights are graph inputs, not constants), so
   nothing is measured, traced or compiled: a swap costs a verify and a load, not a compile
   beside the serving engine (``POST /admin/reload`` answers with its ``seconds``, and the
   ``swap_*`` log lines have them);
3. **switch**: one reference assignment (``runtime.serving``); new requests read the new version,
   in-flight ones finish on the old;
4. **retire** the old: stop admitting, wait for its in-flight requests, stop its engine thread,
   drop the references so its weights and KV cache are freed.

Memory during a swap is the two versions' weights and **one** KV cache: the new engine is built
without a cache and, at the switch, takes the slots the old one's requests do not need; when the
old one has finished, it grows over the whole cache (``aieng.engine.native.succession``). Afterwards one
version's weights and the cache, as before the swap.

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
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

from aieng.engine import Engine
from aieng.engine.native.succession import (
    CacheHandover,
    awaits_kv_cache,
    hand_over_cache,
    own_cache,
    reclaim_cache,
    take_cache,
)
from aieng.errors import AiengError
from aieng.loading.loader import load_version
from aieng.observability import metrics
from aieng.observability.logs import set_service
from aieng.server.process.canary_serving import CanaryKeeper
from aieng.server.process.model_threads import run_on_own_thread
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
    kv_cache: dict | None = None  # {"shared", "slots", "kept_by_old", "reclaimed"}: succession.py

    def to_dict(self) -> dict:
        return asdict(self)


class HotSwapper:
    def __init__(self, runtime):
        self.runtime = runtime
        self._lock = threading.Lock()  # one swap at a time per worker
        self.last: SwapOutcome | None = None  # shown in /health/ready
        self._failed_target: str | None = None  # not retried by the poller until `current` moves on
        self._stop = threading.Event()
        self.canary = CanaryKeeper(runtime)  # the store's canary record, converged on at every check

    @property
    def pinned(self) -> bool:
        return self.runtime.ref.version is not None  # AIENG_MODEL=N@V serves V, whatever `current` says

    def target(self) -> str | None:
        return ModelStore(self.runtime.settings.store).current(self.runtime.ref.name)

    def check(self, *, forced: bool = False) -> SwapOutcome:
        """Swap to ``current`` if it differs from what is served, then load, re-weight or unload
        the canary to match the store. ``forced`` (an admin reload) also retries a version that
        failed before. Runs on a thread of its own, which ends with the check: a swap measures,
        loads and warms up models, and the caller (the watcher, the admin endpoint's executor)
        lives on, so its OpenMP pool would slow the engine's every step (model_threads.py)."""
        return run_on_own_thread(self._check, forced, name="aieng-swap")

    def _check(self, forced: bool) -> SwapOutcome:
        outcome = self._check_current(forced=forced)
        if self.runtime.serving is not None and self.runtime.ready and outcome.status != "busy":
            with self._lock:
                self.canary.converge(forced=forced)
        return outcome

    def _check_current(self, *, forced: bool) -> SwapOutcome:
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
        log.info(
            "hot swap %s@%s -> %s: verifying and loading beside the serving version",
            old.name,
            old.version,
            version,
            extra={"event": "swap_started", "from": old.version, "to": version},
        )
        try:
            new = self._adopt_canary(version) or self._load_and_warm(version)
        except Exception as exc:  # the old version keeps serving
            message = exc.message if isinstance(exc, AiengError) else f"{type(exc).__name__}: {exc}"
            self._failed_target = version
            metrics.MODEL_SWAPS.labels(outcome="failed").inc()
            log.error(
                "hot swap to %s@%s failed; still serving %s: %s",
                old.name,
                version,
                old.version,
                message,
                extra={"event": "swap_failed", "from": old.version, "to": version},
            )
            self.last = SwapOutcome("failed", old.version, version, time.perf_counter() - started, message, time.time())
            return self.last
        runtime.install(new)  # from here new requests go to the new version (queued until its thread runs)
        handover = self._hand_over_cache(old, new)
        if not new.engine_loop.alive:  # an adopted canary's thread runs already
            new.engine_loop.start()
        new.publish(True)
        old.publish(False)
        set_service(new.name, new.version)
        self._failed_target = None
        switched = time.perf_counter() - started
        kv = (
            None
            if handover is None
            else {
                "shared": True,
                "slots": handover.keys[0].shape[0],
                "kept_by_old": handover.kept_by_old,
                "reclaimed": False,
            }
        )
        log.info(
            "hot swap %s@%s -> %s: switched after %.1f s; the old version finishes %d request(s) in flight%s",
            old.name,
            old.version,
            version,
            switched,
            old.in_flight,
            "" if kv is None else f" in {kv['kept_by_old']} of the {kv['slots']} KV slots",
            extra={
                "event": "swap_switched",
                "from": old.version,
                "to": version,
                "seconds": round(switched, 2),
                "kv_cache": kv,
            },
        )
        drained = old.retire(timeout_s=runtime.settings.request_timeout_s)
        if handover is not None:
            kv["reclaimed"] = self._reclaim_cache(old, new, handover)
        freed = self._free(old)
        del old
        metrics.MODEL_SWAPS.labels(outcome="ok").inc()
        self.last = SwapOutcome("swapped", previous, version, switched, None, time.time(), kv)
        log.info(
            "hot swap to %s done (old version retired, %s; its memory freed %s)",
            version,
            "nothing left in flight" if drained else "timed out waiting for in-flight requests",
            freed(),
            extra={"event": "swap_done", "to": version, "kv_cache": kv},
        )
        return self.last

    @staticmethod
    def _free(old: Serving):
        """A check, called once the caller has dropped ``old``, that its weights and engine are
        gone. Reference counting frees them as the last reference goes; a full ``gc.collect()``
        (which stops every thread of the worker, a pause the streams' p99 shows) runs
        only when a reference cycle still holds them."""
        engine, weights = weakref.ref(old.engine), weakref.ref(next(old.loaded.model.parameters()))

        def freed() -> str:
            if engine() is None and weights() is None:
                return "by reference counting"
            start = time.perf_counter()
            gc.collect()
            return f"by a full garbage collection ({time.perf_counter() - start:.3f} s)"

        return freed

    @staticmethod
    def _hand_over_cache(old: Serving, new: Serving) -> CacheHandover | None:
        """One KV cache for both versions (``succession``): on the old engine's thread, stop
        admitting and keep only the slots its requests need; the new engine takes the rest."""
        if not awaits_kv_cache(new.engine):
            return None
        scheduler = old.engine_loop.scheduler

        def hand_over() -> CacheHandover:
            scheduler.drain()
            return hand_over_cache(old.engine, queued=scheduler.num_waiting)

        slots = old.engine.max_rows
        try:
            handover = old.engine_loop.call_between_steps(hand_over).result()
            take_cache(new.engine, handover)
            return handover
        except Exception:  # never leave the new version without a cache: one of its own, as before
            log.exception(
                "handing the KV cache over failed; the new version allocates its own (%d slots)",
                slots,
                extra={"event": "swap_kv_own_cache"},
            )
            own_cache(new.engine, slots)
            return None

    @staticmethod
    def _reclaim_cache(old: Serving, new: Serving, handover: CacheHandover) -> bool:
        """The whole cache to the new engine once the old one's thread has ended."""
        if old.engine_loop.alive:  # stuck in a step past its stop timeout: leave its slots alone
            log.warning(
                "the old version's engine thread did not stop; the new version keeps %d of %d KV slots "
                "until the worker restarts",
                handover.given,
                handover.keys[0].shape[0],
                extra={"event": "swap_kv_not_reclaimed"},
            )
            return False
        new.engine_loop.call_between_steps(lambda: reclaim_cache(new.engine, handover)).result()
        return True

    def _adopt_canary(self, version: str) -> Serving | None:
        """The canary's Serving when it is the version becoming current (a canary that passed):
        loaded and warm already, it takes all the traffic as it is."""
        canary = self.runtime.canary
        if canary is None or canary.version != version:
            return None
        self.canary.adopted()
        return canary

    def _load_and_warm(self, version: str) -> Serving:
        runtime = self.runtime
        ref = ModelRef(runtime.ref.name, version)
        start = time.perf_counter()
        loaded = load_version(ModelStore(runtime.settings.store), ref, runtime.load_config())
        loaded_s = time.perf_counter() - start
        engine = Engine(
            loaded.model,
            loaded.tokenizer,
            context_length=loaded.context_length,
            config=runtime.config.engine,
            replacing=runtime.serving.engine,
            kv_from_replaced=True,
        )
        shared = engine.shared_graphs  # same architecture: nothing measured or compiled
        log.info(
            "hot swap to %s: verified and loaded in %.2f s; warming up (%s)",
            version,
            loaded_s,
            "graphs shared with the serving version"
            if shared
            else "new graphs"
            if runtime.config.engine.compile
            else "eager: compilation off",
            extra={
                "event": "swap_warmup",
                "to": version,
                "shared_graphs": shared,
                "load_s": round(loaded_s, 3),
                "engine_s": round(time.perf_counter() - start - loaded_s, 3),
            },
        )
        engine.warmup()
        if engine.compile_status == "compiling":
            engine.wait_for_compile()  # a swap switches to a fully warm version only
        return Serving.build(ref.name, loaded, engine, runtime.config.scheduler, runtime.settings)

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
