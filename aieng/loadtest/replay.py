"""``aieng loadtest --replay``: captured requests sent again, at the times they arrived.

A built-in workload is a guess at production's mix; a capture (``AIENG_CAPTURE_DIR``,
``server/http/capture.py``) is production's: its prompts, their sampling fields, streamed or not,
and when each arrived. Replaying it against a candidate server (or the same one after a change)
is the closest a load test gets to the traffic that hurt. Each record is sent to its own route
with its messages or prompt and its sampling fields as the client sent them, at its recorded
arrival, scaled by ``--replay-speed``; the run then goes through the load test's own client,
summary, checks and report (``run.run_loadtest``), one level named ``replay``.

Arrival times: within one worker's capture, ``t`` (its monotonic clock); when the records come
from several workers, or from a pid that a later process reused (its ``t`` starts again), those
clocks share no origin, and the records' ``captured_at`` (the wall clock, to the microsecond)
orders and spaces them instead.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from aieng.errors import ConfigError
from aieng.loadtest.client import RunConfig, Timed, run
from aieng.loadtest.summary import summarize, timeline
from aieng.loadtest.workload import ROUTES, Arrival, RequestClass, Workload

CAPTURE_FILE = re.compile(r".+\.jsonl(?:\.\d+)?")  # capture-<pid>.jsonl and its rotated .1, .2, ...
CLASS_NAMES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


class ReplayError(ConfigError):
    """A capture that cannot be replayed: the message names the file, the line and what is wrong."""


@dataclass(frozen=True)
class Replay:
    """What a replay sends: each captured request as a ``Timed`` item, and the workload that frames
    the run (its classes, timeout and measurement window)."""

    sources: tuple[str, ...]
    speed: float
    items: tuple[Timed, ...]
    workload: Workload
    reasons: dict[str, int]  # captured reason -> records replayed

    @property
    def span_s(self) -> float:
        return self.items[-1].due if self.items else 0.0

    def describe(self) -> dict:
        """results.json's ``replay`` entry."""
        return {
            "sources": list(self.sources),
            "speed": self.speed,
            "requests": len(self.items),
            "span_s": round(self.span_s, 3),
            "reasons": self.reasons,
        }


def capture_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files named, a directory standing for the capture files in it (oldest rotation first)."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(
                (p for p in path.iterdir() if p.is_file() and CAPTURE_FILE.fullmatch(p.name)), key=_rotation_order
            )
            if not found:
                raise ReplayError(f"{path} holds no capture files (capture-<pid>.jsonl, as AIENG_CAPTURE_DIR has them)")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise ReplayError(f"{path} does not exist: give capture files or their directory")
    return files


def read_capture(paths: Iterable[str | Path]) -> list[dict]:
    """Every record of the capture files, checked: a line that is not a replayable record is a
    ReplayError naming the file and line."""
    records = []
    for path in capture_files(paths):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReplayError(f"cannot read {path}: {exc}") from None
        for number, line in enumerate(lines, 1):
            if line.strip():
                records.append(_checked(line, f"{path}:{number}"))
    if not records:
        raise ReplayError(f"no captured requests in {', '.join(map(str, paths))}")
    return records


def load_replay(
    paths: Iterable[str | Path],
    *,
    speed: float = 1.0,
    model: str | None = None,
    max_requests: int | None = None,
    timeout_s: float = 120.0,
) -> Replay:
    """The replay of the capture in ``paths``: each record due at its arrival / ``speed`` seconds
    after the first; ``model`` replaces the captured model names; ``max_requests`` keeps the first."""
    if speed <= 0:
        raise ReplayError(f"--replay-speed must be > 0, got {speed:g}")
    paths = [str(p) for p in paths]
    records = read_capture(paths)
    arrivals = _arrivals(records)
    ordered = sorted(zip(arrivals, range(len(records))))[: max_requests or None]
    start = ordered[0][0]
    items = tuple(_timed((at - start) / speed, records[i], model) for at, i in ordered)
    names = Counter(item.cls.name for item in items)
    span = items[-1].due
    workload = Workload(
        name="replay",
        classes=tuple(
            RequestClass(name=name, share=count / len(items), max_tokens=1, text="(captured)")
            for name, count in sorted(names.items())
        ),
        arrival=Arrival(process="constant", rate=len(items) / span if span > 0 else float(len(items))),
        model=model or items[0].body["model"],
        route=items[0].route,
        duration_s=span + 1.0,  # every request is scheduled inside the window: all are measured
        max_requests=len(items),
        warmup_s=0.0,
        cooldown_s=0.0,
        timeout_s=timeout_s,
    )
    reasons = dict(sorted(Counter(records[i]["reason"] for _, i in ordered).items()))
    return Replay(tuple(paths), speed, items, workload, reasons)


def replay_level(replay: Replay, config: RunConfig, slos: dict[str, float], on_warm=None) -> dict:
    """Send the replay; the level a load test reports (``sweep.run_level``'s shape)."""
    records, wall = run(replay.workload, config, on_warm=on_warm, schedule=list(replay.items))
    return {
        "process": "replay",
        "rate": round(len(records) / wall, 4) if wall > 0 else 0.0,
        "users": None,
        "wall_s": round(wall, 3),
        "summary": summarize(records, (0.0, wall + 1e-6), slos),  # every request, over the whole run
        "timeline": timeline(records),
        "records": records,
    }


def _checked(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ReplayError(f"{where}: not a JSON line ({exc}); is this a capture file?") from None
    if not isinstance(record, dict):
        raise ReplayError(f"{where}: a capture record is a JSON object")
    endpoint = record.get("endpoint")
    if endpoint not in ROUTES:
        raise ReplayError(f"{where}: `endpoint` must be one of {ROUTES}, got {endpoint!r}")
    if endpoint == "/v1/chat/completions":
        if not isinstance(record.get("messages"), list) or not record["messages"]:
            raise ReplayError(f"{where}: a chat record needs its `messages` (a redaction hook removed them?)")
    elif not isinstance(record.get("prompt"), (str, list)):
        raise ReplayError(f"{where}: a completions record needs its `prompt` (a redaction hook removed it?)")
    if not isinstance(record.get("sampling") or {}, dict):
        raise ReplayError(f"{where}: `sampling` must be an object of request fields")
    if not isinstance(record.get("model"), str):
        raise ReplayError(f"{where}: `model` must be the requested model's name")
    t = record.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise ReplayError(f"{where}: `t` must be the seconds since the capture started")
    try:
        record["_wall"] = datetime.fromisoformat(str(record.get("captured_at"))).timestamp()
    except ValueError:
        raise ReplayError(f"{where}: `captured_at` must be an ISO-8601 time") from None
    record.setdefault("reason", "sampled")
    return record


def _arrivals(records: list[dict]) -> list[float]:
    """Each record's arrival in seconds on one clock: ``t`` when one worker's uninterrupted capture
    holds them all (its ``t`` rises with ``captured_at``), else ``captured_at``."""
    walls = [r["_wall"] for r in records]
    if len({r.get("worker_pid") for r in records}) == 1:
        by_wall = sorted(range(len(records)), key=walls.__getitem__)
        ts = [records[i]["t"] for i in by_wall]
        if all(a <= b for a, b in zip(ts, ts[1:])):
            return [float(r["t"]) for r in records]
    return walls


def _timed(due: float, record: dict, model: str | None) -> Timed:
    endpoint = record["endpoint"]
    stream = bool(record.get("stream"))
    body = {"model": model or record["model"], **(record.get("sampling") or {}), "stream": stream}
    if endpoint == "/v1/chat/completions":
        body["messages"] = record["messages"]
    else:
        body["prompt"] = record["prompt"]
    if stream:  # the usage chunk: the client then counts tokens as the server does (the post-run checks)
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    max_tokens = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else 16
    cls = RequestClass(name=CLASS_NAMES[endpoint], share=0.0, max_tokens=max_tokens, text="(captured)", stream=stream)
    return Timed(due=due, cls=cls, route=endpoint, body=body)


def _rotation_order(path: Path) -> tuple[str, int]:
    """``capture-7.jsonl.2`` (older) before ``.1`` before ``capture-7.jsonl``: oldest first."""
    stem, _, suffix = path.name.partition(".jsonl")
    return stem, -int(suffix[1:]) if suffix[1:].isdigit() else 0
