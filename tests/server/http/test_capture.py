"""Opt-in capture (server/http/capture.py): off writes nothing; on, what is kept, in which shape,
how the disk is bounded, the redaction hook, and a full queue that drops instead of waiting.

No model and no server: the capture's own objects, fed the parsed bodies the routes hand it. The
request path itself (every route, whole and streamed) is played against a real server in
tests/server/process/test_capture_replay.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from aieng.errors import ConfigError, NotReadyError
from aieng.observability import metrics
from aieng.server.http.capture import RECORD_KEYS, Capture, CaptureWriter
from aieng.server.http.output_guard import Verdict
from aieng.server.http.schemas import ChatCompletionRequest, CompletionRequest
from aieng.settings import Settings

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "reverse: a b c"}], "max_tokens": 8, "seed": 3}
FLAGGED = Verdict("repetition", "the answer ends in 'ab' repeated 12 times", "flag")


def dropped(why: str) -> float:
    return metrics.CAPTURE_DROPPED.labels(why=why)._value.get()


def written(reason: str) -> float:
    return metrics.CAPTURE_RECORDS.labels(reason=reason)._value.get()


def capture_in(directory: Path, *, sample: float = 0.0, seed: int = 0, **writer) -> Capture:
    options = {"max_bytes": 1 << 20, "max_files": 2, **writer}
    return Capture(CaptureWriter(directory, **options), sample=sample, rng=random.Random(seed))


def lines(directory: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("capture-*")) for line in path.read_text().splitlines()]


def chat(capture: Capture, **fields):
    return capture.begin("/v1/chat/completions", ChatCompletionRequest(**{**CHAT, **fields}), "trace-1")


def test_off_by_default_builds_nothing_and_creates_no_directory(tmp_path):
    assert Capture.from_settings(Settings()) is None
    where = tmp_path / "never"
    # the other capture settings alone do not turn it on
    assert Capture.from_settings(Settings(capture_sample=1.0, capture_redact="no.such:hook")) is None
    assert not where.exists() and list(tmp_path.iterdir()) == []


def test_a_record_has_the_contract_keys_and_what_the_client_sent(tmp_path):
    capture = capture_in(tmp_path, sample=1.0)
    seen = chat(capture, temperature=0.0)
    seen.served_version = "1"
    seen.record(200, output="c b a", finish_reason="stop", usage={"prompt_tokens": 9, "completion_tokens": 3})
    body = CompletionRequest(model="demo@1", prompt="add: 2+2", stream=True, max_tokens=4)
    capture.begin("/v1/completions", body, "trace-2").record(200, output="4", finish_reason="stop")
    capture.close()
    first, second = lines(tmp_path)
    assert tuple(first) == RECORD_KEYS
    assert tuple(second) == tuple(k if k != "messages" else "prompt" for k in RECORD_KEYS)
    assert first["messages"] == CHAT["messages"] and second["prompt"] == "add: 2+2"
    # only the fields the client sent, as it sent them: no defaults filled in
    assert first["sampling"] == {"max_tokens": 8, "seed": 3, "temperature": 0.0}
    assert second["sampling"] == {"max_tokens": 4} and second["stream"] is True
    assert (first["reason"], first["status"], first["served_version"], first["request_id"]) == (
        "sampled",
        200,
        "1",
        "trace-1",
    )
    assert first["usage"] == {"prompt_tokens": 9, "completion_tokens": 3} and first["output"] == "c b a"
    assert first["worker_pid"] == os.getpid() and first["guard"] is None and first["error"] is None
    assert datetime.fromisoformat(first["captured_at"]).utcoffset().total_seconds() == 0
    assert 0 <= first["t"] <= second["t"]


def test_guard_flagged_and_5xx_are_always_kept_the_rest_only_when_sampled(tmp_path):
    capture = capture_in(tmp_path, sample=0.0)
    before = {reason: written(reason) for reason in ("guard", "error", "sampled")}
    chat(capture).record(200, output="ab" * 12, verdict=FLAGGED)
    chat(capture).failed(NotReadyError("the server is draining"))
    chat(capture).failed(RuntimeError("boom"))
    chat(capture).record(504, error="the request's deadline passed")
    for status in (200, 400, 429, 499):  # ordinary outcomes: not sampled, not kept
        chat(capture).record(status)
    capture.close()
    records = lines(tmp_path)
    assert [(r["reason"], r["status"]) for r in records] == [
        ("guard", 200),
        ("error", 503),
        ("error", 500),
        ("error", 504),
    ]
    assert records[0]["guard"] == FLAGGED.field()
    assert records[2]["error"] == "RuntimeError: boom" and records[1]["error"] == "the server is draining"
    assert written("guard") - before["guard"] == 1 and written("error") - before["error"] == 3
    assert written("sampled") == before["sampled"]


def test_an_outcome_is_recorded_once(tmp_path):
    capture = capture_in(tmp_path, sample=1.0)
    seen = chat(capture)
    seen.record(504, error="deadline")
    seen.failed(RuntimeError("the handler re-raised it"))  # the route's except sees the same failure
    capture.close()
    assert [r["status"] for r in lines(tmp_path)] == [504]


def test_the_sample_share_keeps_about_that_share(tmp_path):
    capture = capture_in(tmp_path, sample=0.25, seed=7)
    for _ in range(800):
        chat(capture).record(200, output="x")
    capture.close()
    assert 160 <= len(lines(tmp_path)) <= 240  # 200 expected; a binomial's sd here is about 12


def test_the_status_of_a_finished_submission(tmp_path):
    """What the routes hand over: the bridge's submission, whole or streamed."""
    capture = capture_in(tmp_path, sample=1.0)

    def submission(final, text="out", finishes=None):
        return SimpleNamespace(final=final, text_parts=[text] if text else [], finishes=finishes or {})

    ok = SimpleNamespace(error=None, prompt_tokens=5, completion_tokens=2, finish_reason="length")
    failed = SimpleNamespace(error=NotReadyError("out of memory"), finish_reason="error")
    chat(capture).finished(submission(ok, finishes={0: "length"}))
    chat(capture).finished(submission(failed, text=""))
    chat(capture).finished(submission(None))  # the client left
    chat(capture).finished(submission(None), FLAGGED)  # a stream the guard's fallback ended
    capture.close()
    got = [(r["status"], r["reason"], r["output"], r["usage"], r["finish_reason"]) for r in lines(tmp_path)]
    assert got == [
        (200, "sampled", "out", {"prompt_tokens": 5, "completion_tokens": 2}, "length"),
        (503, "error", None, None, "error"),
        (499, "sampled", "out", None, None),
        (200, "guard", "out", None, None),
    ]


def test_rotation_and_pruning_bound_the_directory(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)  # a pid that has exited: a recycled worker's
    for i in range(4):  # a gone worker's files, oldest first
        path = tmp_path / f"capture-{dead}.jsonl{'' if i == 3 else f'.{3 - i}'}"
        path.write_text("{}\n")
        os.utime(path, (1000 + i, 1000 + i))
    alive = tmp_path / f"capture-{os.getppid()}.jsonl.7"  # another live process's: never touched
    alive.write_text("{}\n")
    capture = capture_in(tmp_path, sample=1.0, max_bytes=4096, max_files=2)
    for i in range(300):
        chat(capture).record(200, output=f"answer {i} " + "x" * 40)
    capture.close()
    own = sorted(p.name for p in tmp_path.glob(f"capture-{os.getpid()}.jsonl*"))
    assert own == [f"capture-{os.getpid()}.jsonl", f"capture-{os.getpid()}.jsonl.1", f"capture-{os.getpid()}.jsonl.2"]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    # the gone worker's two newest files stay (max_files), the live process's file too
    assert sorted(p.name for p in tmp_path.glob(f"capture-{dead}.*")) == [
        f"capture-{dead}.jsonl",
        f"capture-{dead}.jsonl.1",
    ]
    assert alive.exists()
    newest = json.loads((tmp_path / own[0]).read_text().splitlines()[-1])
    oldest = json.loads((tmp_path / own[2]).read_text().splitlines()[0])
    assert newest["output"].startswith("answer 299 ") and not oldest["output"].startswith("answer 0 ")


def test_a_record_over_the_file_limit_is_dropped_and_counted(tmp_path):
    capture = capture_in(tmp_path, sample=1.0, max_bytes=1024)
    before = dropped("too_large")
    chat(capture).record(200, output="x" * 2000)
    chat(capture).record(200, output="small")
    capture.close()
    assert [r["output"] for r in lines(tmp_path)] == ["small"]
    assert dropped("too_large") - before == 1


def redact_secrets(record: dict) -> dict | None:
    if record["output"] == "drop me":
        return None
    if record["output"] == "raise":
        raise ValueError("a bug in the hook")
    for message in record["messages"]:
        message["content"] = message["content"].replace("4111-1111", "[card]")
    return {**record, "output": "[redacted]"}


def test_the_redaction_hook_edits_or_drops_and_a_raising_hook_drops_and_counts(tmp_path):
    capture = capture_in(tmp_path, sample=1.0, redact=redact_secrets)
    before = {why: dropped(why) for why in ("redacted", "redact_error")}
    chat(capture, messages=[{"role": "user", "content": "pay with 4111-1111"}]).record(200, output="ok")
    chat(capture).record(200, output="drop me")
    chat(capture).record(503, output="raise", error="failed")  # even a 5xx: the hook decides
    chat(capture).record(200, output="after")
    capture.close()
    records = lines(tmp_path)
    assert [r["output"] for r in records] == ["[redacted]", "[redacted]"]
    assert records[0]["messages"] == [{"role": "user", "content": "pay with [card]"}]
    assert dropped("redacted") - before["redacted"] == 1
    assert dropped("redact_error") - before["redact_error"] == 1


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path):
    entered, release = threading.Event(), threading.Event()

    def slow(record):  # the writer stalls in the hook on the first record
        entered.set()
        release.wait(10)
        return record

    capture = capture_in(tmp_path, sample=1.0, redact=slow, queue_records=2)
    before = dropped("queue_full")
    chat(capture).record(200, output="first")
    assert entered.wait(5)
    start = time.perf_counter()
    for i in range(10):
        chat(capture).record(200, output=f"queued {i}")
    accepted = [capture.writer.offer({"reason": "sampled", "output": "direct"}) for _ in range(3)]
    elapsed = time.perf_counter() - start
    release.set()
    capture.close()
    assert accepted == [False] * 3 and dropped("queue_full") - before == 8 + 3  # two waited, the rest dropped
    assert [r["output"] for r in lines(tmp_path)] == ["first", "queued 0", "queued 1"]
    assert elapsed < 5  # not a speed bound: a put that waited would stall until the hook gives up


@pytest.mark.parametrize(
    "changes,named",
    [
        ({"capture_max_bytes": 10}, "AIENG_CAPTURE_MAX_BYTES"),
        ({"capture_max_files": 0}, "AIENG_CAPTURE_MAX_FILES"),
        ({"capture_sample": 1.5}, "AIENG_CAPTURE_SAMPLE"),
        ({"capture_redact": "no_colon"}, "AIENG_CAPTURE_REDACT"),
        ({"capture_redact": "no_such_module_here:redact"}, "AIENG_CAPTURE_REDACT"),
        ({"capture_redact": "json:no_such_function"}, "AIENG_CAPTURE_REDACT"),
        ({"capture_redact": "json:__doc__"}, "AIENG_CAPTURE_REDACT"),
    ],
)
def test_a_bad_setting_is_a_clear_error_at_start(tmp_path, changes, named):
    with pytest.raises(ConfigError, match=named):
        Capture.from_settings(Settings(capture_dir=str(tmp_path / "capture"), **changes))


def test_settings_from_the_environment_and_a_directory_that_is_a_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AIENG_CAPTURE_DIR", str(tmp_path / "capture"))
    monkeypatch.setenv("AIENG_CAPTURE_SAMPLE", "0.5")
    monkeypatch.setenv("AIENG_CAPTURE_REDACT", f"{__name__}:redact_secrets")
    capture = Capture.from_settings(Settings.from_env())
    assert capture.sample == 0.5 and capture.writer.redact.__name__ == "redact_secrets"
    monkeypatch.setenv("AIENG_CAPTURE_MAX_FILES", "many")
    with pytest.raises(ConfigError, match="AIENG_CAPTURE_MAX_FILES"):
        Settings.from_env()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="AIENG_CAPTURE_DIR"):
        Capture.from_settings(Settings(capture_dir=str(tmp_path / "file")))
