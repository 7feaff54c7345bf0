"""Opt-in capture of requests (``AIENG_CAPTURE_*``): the evidence a failure or a complaint needs.

A request the guard flagged or the server failed (5xx) is exactly the one someone will ask about
later, and a load test is most honest when it replays the prompts production sent. So, with
``AIENG_CAPTURE_DIR`` set, every guard-flagged or 5xx request and a sampled share
(``AIENG_CAPTURE_SAMPLE``) of the rest are written as one JSON object per line: what was asked
(messages or prompt, sampling fields as sent), what came back (text, finish reason, usage, the
guard's verdict, the error) and when it arrived (``t``, which ``aieng loadtest --replay`` replays).
The keys are a contract (``RECORD_KEYS``): eval suites are built from these files.

Off (the default) it costs a ``None`` check per request and touches no disk. On, the event loop
only builds the record dict of a request that is kept and puts it on a bounded queue; a writer
thread per worker runs the redaction hook, serializes and writes. A full queue drops the record
and counts it (``aieng_capture_dropped_total{why}``) rather than wait: capture must never slow
serving. Files are per worker pid (``capture-<pid>.jsonl``: no two processes write one file) and
rotate by size with logging's ``RotatingFileHandler``; files of workers that are gone (recycled,
restarted) are pruned to the newest ``AIENG_CAPTURE_MAX_FILES``, so the directory stays bounded
over a long life of worker recycling.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import queue
import random
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from aieng.errors import AiengError, ConfigError
from aieng.observability import metrics
from aieng.observability.logs import log_event
from aieng.user_hooks import load_hook

log = logging.getLogger("aieng.server")

#: The keys of every record, in this order (tests/server/http/test_capture.py holds them to it).
RECORD_KEYS = (
    "captured_at",
    "t",
    "request_id",
    "worker_pid",
    "reason",
    "endpoint",
    "model",
    "served_version",
    "messages",  # chat; a completion has "prompt" in its place
    "sampling",
    "stream",
    "status",
    "output",
    "finish_reason",
    "usage",
    "guard",
    "error",
)
REASONS = ("sampled", "guard", "error")
DROPPED = ("queue_full", "redacted", "redact_error", "too_large", "write_error")
QUEUE_RECORDS = 1024  # records waiting for the writer thread; past it a record is dropped, never waited for
MIN_FILE_BYTES = 1024
CLIENT_CLOSED_REQUEST = 499  # nginx's code for "the client went away"
_NOT_SAMPLING = {"model", "messages", "prompt", "stream"}  # the request's other top-level fields are its sampling
_FILE = re.compile(r"capture-(\d+)\.jsonl(?:\.\d+)?")
_STOP = object()


class Capture:
    """The deployment's capture: which requests to keep, and the writer they go to."""

    def __init__(self, writer: CaptureWriter, *, sample: float = 0.0, rng=random):
        self.writer, self.sample, self.rng = writer, sample, rng

    @classmethod
    def from_settings(cls, settings) -> Capture | None:
        """``AIENG_CAPTURE_*``, checked (a bad value or a hook that does not import is a
        ConfigError at start), or None when ``AIENG_CAPTURE_DIR`` is empty: capture off."""
        if not settings.capture_dir:
            return None
        if not 0.0 <= settings.capture_sample <= 1.0:
            raise ConfigError(f"AIENG_CAPTURE_SAMPLE={settings.capture_sample!r}: a share in [0, 1]")
        if settings.capture_max_bytes < MIN_FILE_BYTES:
            raise ConfigError(
                f"AIENG_CAPTURE_MAX_BYTES={settings.capture_max_bytes!r}: a capture file needs at least "
                f"{MIN_FILE_BYTES} bytes"
            )
        if settings.capture_max_files < 1:
            raise ConfigError(
                f"AIENG_CAPTURE_MAX_FILES={settings.capture_max_files!r}: keep at least 1 rotated file "
                "(a file that cannot rotate is never bounded)"
            )
        directory = Path(settings.capture_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"AIENG_CAPTURE_DIR={settings.capture_dir!r}: cannot create it ({exc})") from None
        if not os.access(directory, os.W_OK):
            raise ConfigError(f"AIENG_CAPTURE_DIR={settings.capture_dir!r}: not writable by this user")
        redact = (
            load_hook(settings.capture_redact, named_by="AIENG_CAPTURE_REDACT") if settings.capture_redact else None
        )
        writer = CaptureWriter(
            directory, max_bytes=settings.capture_max_bytes, max_files=settings.capture_max_files, redact=redact
        )
        return cls(writer, sample=settings.capture_sample)

    def begin(self, endpoint: str, body, trace_id: str) -> RequestCapture:
        """A request arrived (``body``: its parsed schema); ``finished``/``failed`` decide if it is kept."""
        self.writer.start()  # once per process: a forked worker starts its own thread and clock
        return RequestCapture(self, endpoint, body, trace_id)

    def reason(self, status: int, verdict) -> str | None:
        """Why a request with this outcome is kept, or None: 5xx and guard-flagged always, the rest sampled."""
        if status >= 500:
            return "error"
        if verdict is not None:
            return "guard"
        if self.sample and self.rng.random() < self.sample:
            return "sampled"
        return None

    def close(self, timeout_s: float = 5.0) -> None:
        self.writer.close(timeout_s)


class RequestCapture:
    """One request seen by a capturing server; its outcome is recorded once, by whichever path ends it."""

    __slots__ = ("capture", "endpoint", "body", "trace_id", "wall", "t", "served_version", "done")

    def __init__(self, capture: Capture, endpoint: str, body, trace_id: str):
        self.capture, self.endpoint, self.body, self.trace_id = capture, endpoint, body, trace_id
        self.wall, self.t = time.time(), time.perf_counter() - capture.writer.origin
        self.served_version: str | None = None  # set once a serving version took the request
        self.done = False

    def finished(self, submission, verdict=None) -> None:
        """A request whose events ended, whole or streamed (``submission``: the bridge's)."""
        final = submission.final
        text = "".join(submission.text_parts)
        if final is None:  # the client left, or the guard's fallback ended every choice of a stream
            status, error, usage = (200 if verdict is not None else CLIENT_CLOSED_REQUEST), None, None
        elif final.error is not None:
            status, error, usage = final.error.status, final.error.message, None
        else:
            status, error = 200, None
            usage = {"prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens}
        finish = submission.finishes.get(0) or (final.finish_reason if final is not None else None)
        output = text if text or usage is not None else None  # a finished reply's "" is its answer
        self.record(status, output=output, finish_reason=finish, usage=usage, verdict=verdict, error=error)

    def failed(self, exc: BaseException) -> None:
        """A request that raised before (or instead of) finishing: its status is the error's."""
        if isinstance(exc, AiengError):
            self.record(exc.status, error=exc.message)
        else:  # what the client saw as internal_error; the record keeps what it was
            self.record(500, error=f"{type(exc).__name__}: {exc}")

    def record(self, status: int, *, output=None, finish_reason=None, usage=None, verdict=None, error=None) -> None:
        """Keep the request if its outcome qualifies: the record is built here, written on the writer's thread."""
        if self.done:
            return
        self.done = True
        reason = self.capture.reason(status, verdict)
        if reason is None:
            return
        body = self.body
        chat = hasattr(body, "messages")
        asked = (
            {"messages": [m.model_dump(exclude_unset=True) for m in body.messages]} if chat else {"prompt": body.prompt}
        )
        record = {
            "captured_at": datetime.fromtimestamp(self.wall, UTC).isoformat(timespec="microseconds"),
            "t": round(self.t, 6),
            "request_id": self.trace_id,
            "worker_pid": os.getpid(),
            "reason": reason,
            "endpoint": self.endpoint,
            "model": body.model,
            "served_version": self.served_version,
            **asked,
            "sampling": body.model_dump(exclude_unset=True, by_alias=True, exclude=_NOT_SAMPLING),
            "stream": body.stream,
            "status": status,
            "output": output,
            "finish_reason": finish_reason,
            "usage": usage,
            "guard": verdict.field() if verdict is not None else None,
            "error": error,
        }
        self.capture.writer.offer(record)


class CaptureWriter:
    """A bounded queue and one thread per process that redacts, serializes and writes records.

    ``offer`` never blocks: the event loop calls it. The thread, the queue and the clock ``t``
    counts from are per process and start at the first use in it, so an object built in gunicorn's
    master before fork gives each worker its own (threads do not survive a fork)."""

    def __init__(
        self, directory: Path, *, max_bytes: int, max_files: int, redact=None, queue_records: int = QUEUE_RECORDS
    ):
        self.directory, self.max_bytes, self.max_files = Path(directory), max_bytes, max_files
        self.redact, self.queue_records = redact, queue_records
        self.origin = 0.0  # perf_counter when this process's capture started
        self._pid: int | None = None
        self._pending: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._hook_failed = self._write_failed = False  # each logged once per process; counters have the rest

    @property
    def path(self) -> Path:
        """This process's file (its rotated ones add ``.1``, ``.2``, ... and the oldest goes)."""
        return self.directory / f"capture-{os.getpid()}.jsonl"

    def start(self) -> None:
        if self._pid == os.getpid():
            return
        self._pid, self.origin = os.getpid(), time.perf_counter()
        self._pending = queue.Queue(self.queue_records)
        for why in DROPPED:  # at zero, so a rate() over them has a series before the first drop
            metrics.CAPTURE_DROPPED.labels(why=why)
        for reason in REASONS:
            metrics.CAPTURE_RECORDS.labels(reason=reason)
        self._thread = threading.Thread(target=self._run, args=(self._pending,), name="aieng-capture", daemon=True)
        self._thread.start()

    def offer(self, record: dict) -> bool:
        """Queue ``record`` for writing; False (and counted) when the queue is full."""
        self.start()
        try:
            self._pending.put_nowait(record)
        except queue.Full:
            metrics.CAPTURE_DROPPED.labels(why="queue_full").inc()
            return False
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued and stop this process's thread (the app's shutdown)."""
        if self._pid != os.getpid() or self._thread is None:
            return
        try:
            self._pending.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass  # the thread is stuck (a hook that never returns); it is a daemon and goes with the process
        self._thread.join(timeout_s)
        self._pid = self._thread = self._pending = None

    def _run(self, pending: queue.Queue) -> None:
        out: _RotatingLines | None = None
        try:
            while (record := pending.get()) is not _STOP:
                line = self._line(record)
                if line is None:
                    continue
                try:
                    if out is None:
                        out = self._open()
                    out.write_line(line)
                except OSError as exc:  # a full disk, a directory removed: serving goes on
                    metrics.CAPTURE_DROPPED.labels(why="write_error").inc()
                    if not self._write_failed:
                        self._write_failed = True
                        log.warning("capture: cannot write %s: %s", self.path, exc, extra={"event": "capture_error"})
                    continue
                metrics.CAPTURE_RECORDS.labels(reason=record["reason"]).inc()
        finally:
            if out is not None:
                out.close()

    def _line(self, record: dict) -> str | None:
        """The record's JSON line after the redaction hook, or None (counted) when it is not written."""
        if self.redact is not None:
            try:
                redacted = self.redact(dict(record))
                if redacted is not None and not isinstance(redacted, dict):
                    raise TypeError(f"the hook returned a {type(redacted).__name__}, not a dict or None")
            except Exception as exc:  # the hook's bug drops its record; the request was answered long ago
                metrics.CAPTURE_DROPPED.labels(why="redact_error").inc()
                if not self._hook_failed:
                    self._hook_failed = True
                    log.warning(
                        "capture: the redaction hook raised %s; its records are dropped",
                        type(exc).__name__,
                        extra={"event": "capture_redact_error"},
                    )
                return None
            if redacted is None:
                metrics.CAPTURE_DROPPED.labels(why="redacted").inc()
                return None
            record = redacted
        # ASCII only (non-ASCII as \\u escapes): a line's length is then its size in bytes, which
        # is what the rotation compares against the limit
        line = json.dumps(record, ensure_ascii=True, separators=(",", ":"), default=str)
        if len(line) + 1 >= self.max_bytes:  # alone over the limit: it would break the bound
            metrics.CAPTURE_DROPPED.labels(why="too_large").inc()
            return None
        return line

    def _open(self) -> _RotatingLines:
        self.directory.mkdir(parents=True, exist_ok=True)
        prune_gone_workers(self.directory, keep=self.max_files)
        out = _RotatingLines(
            self.path, self.max_bytes, self.max_files, lambda: prune_gone_workers(self.directory, keep=self.max_files)
        )
        log_event(log, "capture_started", path=str(self.path), max_bytes=self.max_bytes, max_files=self.max_files)
        return out


class _RotatingLines(logging.handlers.RotatingFileHandler):
    """logging's size rotation (``capture-<pid>.jsonl`` → ``.1`` → ``.2`` …, the oldest deleted),
    used as a plain line writer: no logger in between, and an error raises to the writer, which
    counts it, instead of logging's print to stderr."""

    def __init__(self, path: Path, max_bytes: int, backups: int, after_rollover):
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        self.after_rollover = after_rollover

    def format(self, record: logging.LogRecord) -> str:
        return record.msg

    def handleError(self, record: logging.LogRecord) -> None:
        raise  # called inside emit's except: re-raises what failed

    def doRollover(self) -> None:
        super().doRollover()
        self.after_rollover()

    def write_line(self, line: str) -> None:
        self.emit(logging.makeLogRecord({"msg": line}))


def prune_gone_workers(directory: Path, *, keep: int) -> None:
    """Delete capture files of workers that no longer run, oldest first, past the newest ``keep``.

    A recycled or restarted worker leaves its files behind and its successor writes under a new
    pid; without this the directory would grow with every recycle. A live worker's files are its
    own to rotate: never touched here (deleting a file another process writes would lose it)."""
    gone = []
    for path in directory.iterdir():
        found = _FILE.fullmatch(path.name)
        if found and int(found.group(1)) != os.getpid() and not _alive(int(found.group(1))):
            try:
                gone.append((path.stat().st_mtime, path))
            except FileNotFoundError:
                continue
    gone.sort()
    for _, path in gone[: max(0, len(gone) - keep)]:
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
