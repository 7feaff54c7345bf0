"""Issue 34's "keep the evidence", end to end: a real ``aieng serve`` with capture on writes what
each route ended with (whole and streamed, chat and completions, guard-flagged, a 5xx), through
the deployment's redaction hook, and ``aieng loadtest --replay`` sends that capture back to it.

One eager server for the module (a start costs seconds; capture sits in the HTTP layer): capture
on with every ordinary request sampled, the guard's hook check flagging prompts that ask for it,
and a redaction hook; both hooks live in a module the server imports from its PYTHONPATH, as a
deployment's would.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter

import httpx
import pytest

from aieng.bench.server_process import ServerProcess
from aieng.server.http.capture import RECORD_KEYS
from tests.command import aieng

HOOKS = """
def guard(prompt, text):
    return "the prompt asked to be flagged" if "FLAG" in prompt else None


def redact(record):
    for message in record.get("messages") or []:
        message["content"] = message["content"].replace("SECRET-42", "[redacted]")
    if isinstance(record.get("prompt"), str):
        record["prompt"] = record["prompt"].replace("SECRET-42", "[redacted]")
    return record
"""
PROMPT = "<|bos|><|user|>add: 27+58<|end|><|assistant|>"


@pytest.fixture(scope="module")
def capturing(tmp_path_factory, demo_store):
    """(server, capture directory)."""
    root = tmp_path_factory.mktemp("capture")
    (root / "capture_hooks.py").write_text(HOOKS)
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
        "AIENG_CAPTURE_DIR": str(root / "capture"),
        "AIENG_CAPTURE_SAMPLE": "1.0",
        "AIENG_CAPTURE_REDACT": "capture_hooks:redact",
        "AIENG_GUARD_CHECKS": "hook",
        "AIENG_GUARD_HOOK": "capture_hooks:guard",
    }
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "1", "--no-compile"], env=env) as server:
        yield server, root / "capture"


def captured(directory, count: int, timeout_s: float = 20.0) -> list[dict]:
    """The capture's records once ``count`` are written (the writer thread is behind the replies)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = [json.loads(line) for p in sorted(directory.glob("capture-*")) for line in p.read_text().splitlines()]
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def send(client: httpx.Client, route: str, body: dict) -> tuple[int, str]:
    """POST ``body`` (reading a stream to its end); the status and the trace id."""
    with client.stream("POST", route, json=body) as response:
        response.read()
        return response.status_code, response.headers["x-trace-id"]


@pytest.mark.timeout(300)
def test_capture_keeps_each_outcome_and_the_capture_replays_against_the_server(capturing, tmp_path):
    server, directory = capturing
    chat = "/v1/chat/completions"
    sent = [  # route, body, expected (status, reason)
        (chat, {"messages": [{"role": "user", "content": "reverse: SECRET-42 stone"}], "max_tokens": 6}, 200),
        (chat, {"messages": [{"role": "user", "content": "reverse: FLAG me"}], "max_tokens": 6, "stream": True}, 200),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.0, "seed": 1}, 200),
        ("/v1/completions", {"prompt": "FLAG " + PROMPT, "max_tokens": 4, "stream": True}, 200),
        (chat, {"messages": [{"role": "user", "content": "add: 1+2"}], "max_tokens": 6, "timeout": 1e-6}, 504),
    ]
    traces = []
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for route, body, status in sent:
            got, trace = send(client, route, {"model": "demo", **body})
            assert got == status, (route, body)
            traces.append(trace)

    records = {r["request_id"]: r for r in captured(directory, len(sent))}
    assert set(records) == set(traces)
    ordered = [records[trace] for trace in traces]
    for (route, body, status), record in zip(sent, ordered):
        assert tuple(record) == tuple(k if k != "messages" or "chat" in route else "prompt" for k in RECORD_KEYS)
        assert (record["endpoint"], record["status"], record["stream"]) == (route, status, body.get("stream", False))
        assert record["model"] == "demo" and record["served_version"] == "1"
        assert record["sampling"] == {k: v for k, v in body.items() if k not in ("messages", "prompt", "stream")}
    assert [r["reason"] for r in ordered] == ["sampled", "guard", "sampled", "guard", "error"]
    plain, flagged_stream, completion, flagged_whole, failed = ordered
    assert plain["messages"] == [{"role": "user", "content": "reverse: [redacted] stone"}]  # the hook ran
    assert isinstance(plain["output"], str) and plain["finish_reason"] in ("stop", "length")
    assert plain["usage"]["completion_tokens"] > 0
    assert completion["prompt"] == PROMPT and completion["usage"]["prompt_tokens"] > 0
    for flagged in (flagged_stream, flagged_whole):
        assert flagged["guard"] == {"check": "hook", "action": "flag", "reason": "the prompt asked to be flagged"}
    assert failed["output"] is None and failed["usage"] is None and "deadline" in failed["error"]
    pids = {r["worker_pid"] for r in ordered}
    assert [p.name for p in directory.iterdir()] == [f"capture-{pid}.jsonl" for pid in pids]  # one worker's file
    assert 0 <= plain["t"] < failed["t"]

    out = tmp_path / "replay"
    result = aieng(
        "loadtest",
        *("--url", server.base_url, "--out", out, "--replay", directory, "--replay-speed", "4"),
        *("--no-progress", "--max-error-rate", "0.5"),  # the captured 5xx fails again: a 504 is its deadline's
    )
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((out / "results.json").read_text())
    assert data["replay"]["requests"] == len(sent)
    assert data["replay"]["reasons"] == {"error": 1, "guard": 2, "sampled": 2}
    summary = data["levels"][0]["summary"]["all"]
    assert (summary["requests"], summary["ok"], summary["errors_by_status"]) == (5, 4, {"504": 1})
    assert {c["name"]: c["passed"] for c in data["checks"]}["metrics_agree"] is True
    # The replayed requests were captured too: each original's route and text once more. Compared by content,
    # not by count, so a stray request from elsewhere on the machine cannot fail it (and is shown if one does).
    replayed = [r for r in captured(directory, 2 * len(sent)) if r["request_id"] not in records]
    assert Counter(map(said, replayed)) >= Counter(map(said, ordered)), [said(r) for r in replayed]


def said(record: dict) -> tuple[str, str]:
    """What a captured request asked: its route and its (redacted) messages or prompt."""
    return record["endpoint"], json.dumps(record.get("messages") or record.get("prompt"))
