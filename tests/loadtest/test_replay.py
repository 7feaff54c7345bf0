"""``aieng loadtest --replay``: a capture's requests go out as they came in (route, messages or
prompt, sampling fields, streamed or not) at their recorded times, through the load test's own
report; a file that is not a capture is one clear error line.

The server here is a test double that keeps what it received and when (no model: what is checked
is what the client sends). A real server's capture replayed against it is
tests/server/process/test_capture_replay.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from aieng.bench.server_process import free_port
from aieng.loadtest.replay import load_replay
from tests.command import aieng

START = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def record(at: float, endpoint: str = "/v1/chat/completions", *, pid: int = 41, stream: bool = False, **fields) -> dict:
    """A capture record of a request that arrived ``at`` seconds into the capture (``t`` and ``captured_at`` agree)."""
    asked = {"messages": [{"role": "user", "content": f"at {at}"}]} if "chat" in endpoint else {"prompt": f"at {at}"}
    return {
        "captured_at": (START + timedelta(seconds=at)).isoformat(timespec="microseconds"),
        "t": at,
        "request_id": f"trace-{at}",
        "worker_pid": pid,
        "reason": "sampled",
        "endpoint": endpoint,
        "model": "demo",
        "served_version": "1",
        **asked,
        "sampling": {"max_tokens": 3, "temperature": 0.0},
        "stream": stream,
        "status": 200,
        "output": "x",
        "finish_reason": "length",
        "usage": {"prompt_tokens": 4, "completion_tokens": 3},
        "guard": None,
        "error": None,
        **fields,
    }


def write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def recording_double():
    """Both generation routes; each request's arrival, path and body kept in ``app.state.seen``."""
    app = FastAPI()
    app.state.seen = []

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "demo"}]}

    async def answer(request: Request):
        body = await request.json()
        app.state.seen.append((time.monotonic(), request.url.path, body))
        tokens = body.get("max_tokens") or 3
        usage = {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens}
        if not body.get("stream"):
            return {"id": "x", "object": "x", "created": 0, "model": "demo", "choices": [], "usage": usage}

        async def stream():
            for _ in range(tokens):
                await asyncio.sleep(0.01)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': 'x', 'finish_reason': None}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    app.post("/v1/chat/completions")(answer)
    app.post("/v1/completions")(answer)
    return app


@pytest.fixture
def double():
    app = recording_double()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", app.state.seen
    server.should_exit = True
    thread.join(10)


def test_a_capture_is_replayed_with_its_routes_bodies_and_timing(double, tmp_path):
    url, seen = double
    capture = write(
        tmp_path / "capture-41.jsonl",
        [  # written in finishing order: the replay orders them by arrival
            record(10.8, "/v1/completions", sampling={"max_tokens": 2, "seed": 5, "stop": ["\n"]}),
            record(10.0, stream=True),
            record(10.4, reason="guard", guard={"check": "empty", "action": "flag", "reason": "empty"}),
        ],
    )
    out = tmp_path / "out"
    result = aieng("loadtest", "--url", url, "--out", out, "--replay", capture, "--replay-speed", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "replaying 3 captured requests" in result.stdout
    paths = [path for _, path, _ in seen]
    assert paths == ["/v1/chat/completions", "/v1/chat/completions", "/v1/completions"]
    first, second, third = (body for _, _, body in seen)
    assert first == {
        "model": "demo",
        "max_tokens": 3,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},  # usage counted as the server counts it
        "messages": [{"role": "user", "content": "at 10.0"}],
    }
    assert second["stream"] is False and "stream_options" not in second
    assert third == {"model": "demo", "max_tokens": 2, "seed": 5, "stop": ["\n"], "stream": False, "prompt": "at 10.8"}
    data = json.loads((out / "results.json").read_text())
    assert data["replay"] == {
        "sources": [capture],
        "speed": 2.0,
        "requests": 3,
        "span_s": 0.4,
        "reasons": {"guard": 1, "sampled": 2},
    }
    summary = data["levels"][0]["summary"]
    assert summary["all"]["requests"] == summary["all"]["ok"] == 3 and summary["all"]["ttft_s"]["p50"] is not None
    assert set(summary["classes"]) == {"chat", "completions"}
    assert (out / "report.html").exists() and len((out / "requests.jsonl").read_text().splitlines()) == 3


@pytest.mark.perf
def test_the_replay_keeps_the_captured_pace(double, tmp_path):
    url, seen = double
    capture = write(tmp_path / "capture-41.jsonl", [record(at) for at in (20.0, 20.6, 21.2)])
    result = aieng("loadtest", "--url", url, "--out", tmp_path, "--replay", capture, "--replay-speed", "2")
    assert result.returncode == 0, result.stderr
    gaps = [b - a for (a, _, _), (b, _, _) in zip(seen, seen[1:])]
    assert gaps == [pytest.approx(0.3, abs=0.15)] * 2  # 0.6 s apart when captured, at twice the pace


def test_a_directory_of_workers_is_ordered_by_the_wall_clock(tmp_path):
    capture = tmp_path / "capture"
    capture.mkdir()
    # two workers: their t count from different starts, so captured_at orders them
    write(capture / "capture-41.jsonl.1", [record(1.0), record(3.0)])
    write(capture / "capture-41.jsonl", [record(5.0)])
    write(capture / "capture-42.jsonl", [record(2.0, pid=42, t=100.0), record(4.0, pid=42, t=102.0)])
    (capture / "notes.txt").write_text("not a capture file")
    replay = load_replay([capture])
    assert [item.body["messages"][0]["content"] for item in replay.items] == [f"at {t}.0" for t in (1, 2, 3, 4, 5)]
    assert [round(item.due, 6) for item in replay.items] == [0.0, 1.0, 2.0, 3.0, 4.0]
    fewer = load_replay([capture], model="demo@1", max_requests=2, speed=0.5)
    assert [item.body["model"] for item in fewer.items] == ["demo@1", "demo@1"]
    assert [item.due for item in fewer.items] == [0.0, 2.0]  # half the pace: twice the gaps


def test_one_workers_capture_is_timed_by_its_own_clock_t(tmp_path):
    records = [record(0.0, t=5.0), record(1.0, t=5.25), record(2.0, t=6.5)]
    replay = load_replay([write(tmp_path / "capture-41.jsonl", records)])
    assert [item.due for item in replay.items] == [0.0, 0.25, 1.5]
    # a pid reused by a later worker: its t starts again, so the wall clock orders the two
    records += [record(3.0, t=0.5), record(3.5, t=1.0)]
    replay = load_replay([write(tmp_path / "capture-41.jsonl", records)])
    assert [item.due for item in replay.items] == [0.0, 1.0, 2.0, 3.0, 3.5]


@pytest.mark.parametrize(
    "content,says",
    [
        (None, "does not exist"),
        ("", "no captured requests"),
        ("this is not json\n", "not a JSON line"),
        ('["a list"]\n', "a JSON object"),
        (json.dumps(record(1.0, messages=[])) + "\n", "needs its `messages`"),
        (json.dumps({**record(1.0, "/v1/completions"), "prompt": None}) + "\n", "needs its `prompt`"),
        (json.dumps(record(1.0, endpoint="/v1/embeddings")) + "\n", "`endpoint` must be one of"),
        (json.dumps(record(1.0, captured_at="yesterday")) + "\n", "`captured_at` must be"),
        (json.dumps(record(1.0, t="soon")) + "\n", "`t` must be"),
    ],
)
def test_a_file_that_is_not_a_capture_is_one_clear_error(tmp_path, content, says):
    path = tmp_path / "capture-1.jsonl"
    if content is not None:
        path.write_text(content)
    result = aieng("loadtest", "--url", "http://127.0.0.1:9", "--out", tmp_path / "out", "--replay", path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("aieng: error: ") and says in result.stderr, result.stderr
    if content:
        assert "capture-1.jsonl:1" in result.stderr or "no captured" in result.stderr


def test_replay_refuses_the_flags_that_shape_a_workloads_arrivals(tmp_path):
    path = write(tmp_path / "capture-1.jsonl", [record(1.0)])
    result = aieng("loadtest", "--url", "http://127.0.0.1:9", "--out", tmp_path, "--replay", path, "--rate-sweep")
    assert result.returncode != 0
    result = aieng(
        "loadtest", "--url", "http://127.0.0.1:9", "--out", tmp_path, "--replay", path, "--replay-speed", "0"
    )
    assert result.returncode == 1 and "--replay-speed must be > 0" in result.stderr
