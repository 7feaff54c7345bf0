"""What a starting process is doing, logged from its first second and shown by ``/health/ready``.

A start-up goes through named phases: ``import`` (torch, transformers: seconds on their own),
``verify`` (every hash of the version), ``load`` (weights into memory), ``workers`` (the master
forks them), ``engine`` (build the engine and its scheduler), ``warmup`` (one detail per shape,
from ``Engine.warmup(progress=...)``), then ``ready``. In ``aieng serve`` the master runs up to
``workers`` (and ``warmup`` when it warms before fork), each worker the rest; a worker inherits
the master's object at fork and starts its own heartbeat.

Every phase start and end is one JSON log line (``startup_phase_start``, ``startup_phase_end``
with its ``seconds``), every new detail one ``startup_progress`` line, and while a phase runs a
daemon thread logs ``startup_heartbeat`` ("still warmup prefill batch 8 × 32 tokens (3/6) after
15 s") whenever nothing was logged for ``heartbeat_s`` (5 s): whatever a phase does — a
torch.compile of minutes, a slow disk — the log moves at least every few seconds. A start-up
silent for more than 10 s is a bug.

Every method is thread-safe, so a phase can be set from any thread: the warm-up thread, or the
engine later reporting a compile it runs in the background while the server already answers
(``begin("compile", ...)`` after ``finish()``, then ``finish()`` again).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

from aieng.errors import AiengError
from aieng.store import ModelStore, VerifyReport

log = logging.getLogger("aieng.server.startup")

STARTING = "starting"  # before the first phase begins
READY = "ready"
FAILED = "failed"
HEARTBEAT_S = 5.0

_instances: weakref.WeakSet[StartupProgress] = weakref.WeakSet()


class StartupProgress:
    def __init__(self, *, heartbeat_s: float = HEARTBEAT_S, logger: logging.Logger = log, clock=time.monotonic):
        self.heartbeat_s = heartbeat_s
        self._log = logger
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._phase = STARTING
        self._detail = ""
        self._started = self._phase_started = self._last_line = clock()
        self._thread: threading.Thread | None = None
        self._thread_pid: int | None = None
        self.phase_seconds: dict[str, float] = {}  # the last run of each phase, for the ready line
        _instances.add(self)

    # -- what a start-up reports ---------------------------------------------------------------
    def begin(self, phase: str, detail: str = "", **fields) -> None:
        """End the current phase (its seconds logged) and start ``phase``."""
        with self._lock:
            self._end_current()
            self._phase, self._detail, self._phase_started = phase, detail, self._clock()
            self._emit("startup_phase_start", f"{phase} {detail}".strip(), phase=phase, detail=detail, **fields)
        self._ensure_heartbeat()

    def detail(self, text: str, **fields) -> None:
        """Same phase, a new step of it (a warm-up shape): logged, shown by /health/ready.

        ``Engine.warmup(progress=progress.detail)`` calls it before each shape it runs."""
        with self._lock:
            self._detail = text
            self._emit(
                "startup_progress",
                f"{self._phase} {text}",
                phase=self._phase,
                detail=text,
                phase_s=round(self._clock() - self._phase_started, 2),
                **fields,
            )

    def finish(self, **fields) -> None:
        """The process is ready: the current phase ends, the heartbeat goes quiet."""
        with self._lock:
            self._end_current()
            self._phase, self._detail, self._phase_started = READY, "", self._clock()
            self._emit(
                "startup_ready",
                f"ready after {self._clock() - self._started:.1f}s",
                phase=READY,
                seconds=round(self._clock() - self._started, 2),
                phases=dict(self.phase_seconds),
                **fields,
            )
        self._wake.set()

    def fail(self, error: BaseException) -> None:
        """The current phase failed: one error line (with the traceback unless it is an AiengError,
        a refusal that explains itself); /health/ready shows the phase, not the message."""
        with self._lock:
            failed = self._phase
            self._phase, self._detail = FAILED, f"{failed}: {type(error).__name__} (the log line startup_failed has it)"
            self._emit(
                "startup_failed",
                f"{failed} failed: {type(error).__name__}: {error}",
                level=logging.ERROR,
                phase=failed,
                seconds=round(self._clock() - self._phase_started, 2),
                exc_info=None if isinstance(error, AiengError) else error,
            )
        self._wake.set()

    # -- what /health/ready shows --------------------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    def snapshot(self) -> dict:
        with self._lock:
            now = self._clock()
            return {
                "phase": self._phase,
                "detail": self._detail,
                "elapsed_s": round(now - self._phase_started, 1),
                "startup_s": round(now - self._started, 1),
            }

    @property
    def running(self) -> bool:
        """A phase is under way (not ready, not failed)."""
        return self._phase not in (READY, FAILED)

    # -- the heartbeat -------------------------------------------------------------------------
    def stop_heartbeat(self) -> None:
        """Stop and join the heartbeat thread (the master does before it forks workers)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and self._thread_pid == os.getpid():
            self._wake.set()
            thread.join(timeout=2 * self.heartbeat_s)

    def _ensure_heartbeat(self) -> None:
        with self._lock:  # a forked child inherits the object but not the thread: one thread per process
            if self._thread is not None and self._thread_pid == os.getpid() and self._thread.is_alive():
                return
            self._thread_pid = os.getpid()
            self._thread = threading.Thread(target=self._beat, name="aieng-startup-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        me = threading.current_thread()
        while True:
            self._wake.wait(timeout=min(1.0, self.heartbeat_s / 5))
            self._wake.clear()
            with self._lock:
                if self._thread is not me or not self.running:
                    if self._thread is me:
                        self._thread = None  # quiet until the next begin()
                    return
                now = self._clock()
                if now - self._last_line >= self.heartbeat_s:
                    seconds = now - self._phase_started
                    doing = f"{self._phase} {self._detail}".strip()
                    self._emit(
                        "startup_heartbeat",
                        f"still {doing} after {seconds:.0f} s",
                        phase=self._phase,
                        detail=self._detail,
                        phase_s=round(seconds, 1),
                    )

    # -- internals (called with the lock held) -------------------------------------------------
    def _end_current(self) -> None:
        if not self.running or self._phase == STARTING:
            return
        seconds = self._clock() - self._phase_started
        self.phase_seconds[self._phase] = round(seconds, 2)
        self._emit(
            "startup_phase_end", f"{self._phase} took {seconds:.1f}s", phase=self._phase, seconds=round(seconds, 2)
        )

    def _emit(self, event: str, message: str, *, level: int = logging.INFO, exc_info=None, **fields) -> None:
        self._last_line = self._clock()
        self._log.log(
            level,
            message,
            exc_info=exc_info,
            extra={
                "event": event,
                "pid": os.getpid(),
                "startup_s": round(self._last_line - self._started, 2),
                **fields,
            },
        )

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # a lock held by a parent thread at fork would never be released
        self._wake = threading.Event()
        self._thread = None


class PhasedStore(ModelStore):
    """The store as ``load_version`` sees it, reporting the phases of a load: ``verify`` while
    the hashes are checked, then (``load_next``) ``load`` the moment they check out, so the two
    are logged apart without hashing the files twice.

    ``verified`` (shared, filled here): what was hashed and found whole, by version, with each
    file's size, times and inode at that moment. On CUDA the master verifies and each worker
    loads; a worker (forked with this record) re-hashes a version only when a file changed since
    the master's check (any write moves a file's ctime, which no user can set back), so N workers
    do not read every byte N more times before they load."""

    def __init__(self, root, progress: StartupProgress, *, load_next: bool, verified: dict | None = None):
        super().__init__(root)
        self.progress = progress
        self.load_next = load_next
        self.verified = verified

    def verify_or_raise(self, ref):
        ref = type(ref)(ref.name, self.resolve(ref))
        directory = self.version_dir(ref.name, ref.version)
        files = [p for p in directory.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        seen = file_fingerprint(directory, files)
        key = f"{ref.name}@{ref.version}"
        if self.verified is not None and self.verified.get(key) == seen:
            self.progress.begin("verify", f"{key}: {len(files)} files unchanged since they were hashed before fork")
            report = VerifyReport(ref.name, ref.version, [])
        else:
            self.progress.begin("verify", f"sha256 of {key}: {len(files)} files, {size / 2**20:.0f} MiB")
            report = super().verify_or_raise(ref)
            if self.verified is not None:
                self.verified[key] = seen
        if self.load_next:
            weights = sum(p.stat().st_size for p in files if p.suffix == ".safetensors")
            self.progress.begin("load", f"{ref.name}@{ref.version} weights, {weights / 2**20:.0f} MiB")
        return report


def file_fingerprint(directory, files) -> dict[str, tuple[int, int, int, int]]:
    """Per file: size, mtime and ctime (ns) and inode; equal only if no file was written or replaced."""
    stats = {str(p.relative_to(directory)): p.stat() for p in files}
    return {name: (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) for name, st in sorted(stats.items())}


def _reset_after_fork() -> None:
    for progress in list(_instances):
        progress._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
