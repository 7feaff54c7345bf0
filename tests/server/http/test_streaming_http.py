"""SSE framing and client disconnects, over raw HTTP."""

import json
import socket
import time

import httpx


def decode_steps(base_url) -> float:
    from aieng.observability.scrape import scrape

    return scrape(base_url).value("aieng_batch_size_count")


def wait_until_engine_idle(base_url, timeout=5.0) -> float:
    """Seconds until the engine stops stepping (the decode-step count stays put for 0.3 s)."""
    start = time.monotonic()
    previous = decode_steps(base_url)
    while time.monotonic() - start < timeout:
        time.sleep(0.3)
        current = decode_steps(base_url)
        if current == previous:
            return time.monotonic() - start
        previous = current
    raise AssertionError("the engine kept stepping: the abandoned row was not removed")


def test_sse_chunks_end_with_done(server, render):
    body = {
        "model": "demo",
        "prompt": render("reverse: apple stone river"),
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
        timing = resp.headers["server-timing"]
    assert timing.startswith("headers;dur=") and "a stream's tokens follow" in timing  # says what it measured
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "river stone apple"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len({c["id"] for c in chunks}) == 1


def _long_body(render, stream):
    return {
        "model": "demo",
        "prompt": render("reverse: egg fish gold"),
        "max_tokens": 480,
        "temperature": 0,
        "stream": stream,
        "ignore_eos": True,
        "stop": None,
        "repetition_penalty": 1.0,
    }


def _finished_lines(server):
    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    return [line for line in lines if line["event"] == "request_finished"]


# A row that nobody stopped runs all of its 480 tokens: the first from prefill, then one decode
# step per token. Fewer steps than that between an idle engine and an idle engine again can only
# mean the disconnect removed it. (How many fewer depends on how soon the event loop sees the
# closed socket on a busy machine, so the bound is the full run, not a guess at that lag.)
FULL_RUN_STEPS = 480 - 1


def test_streaming_client_disconnect_removes_the_row(server, render):
    body = _long_body(render, True)  # ignore_eos: 480 tokens, seconds of work if nobody stopped it
    wait_until_engine_idle(server.base_url)
    before = decode_steps(server.base_url)
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as resp:
        for _, _line in zip(range(3), resp.iter_lines()):
            pass
    # the connection is closed here; the row must leave now, not after 480 tokens
    wait_until_engine_idle(server.base_url)
    assert decode_steps(server.base_url) - before < FULL_RUN_STEPS
    assert _finished_lines(server)[-1]["outcome"] == "client_disconnected"


def test_non_streaming_client_disconnect_removes_the_row(server, render):
    body = json.dumps(_long_body(render, False)).encode()
    wait_until_engine_idle(server.base_url)
    before = decode_steps(server.base_url)
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        conn.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        _wait_until(lambda: decode_steps(server.base_url) > before)  # its row is decoding; hang up
    wait_until_engine_idle(server.base_url)
    assert decode_steps(server.base_url) - before < FULL_RUN_STEPS
    assert _finished_lines(server)[-1]["outcome"] == "client_disconnected"


def _wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the request never started decoding"
        time.sleep(0.005)
