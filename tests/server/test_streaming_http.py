"""SSE framing and client disconnects, over raw HTTP."""

import json
import time

import httpx
import pytest


def running(base_url) -> float:
    from aieng.observability.scrape import scrape

    return scrape(base_url).value("aieng_requests_running")


def wait_for_running(base_url, value, timeout=5.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if running(base_url) == value:
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError(f"aieng_requests_running never became {value}")


def test_sse_chunks_end_with_done(server, render):
    body = {"model": "demo", "prompt": render("reverse: apple stone river"), "max_tokens": 12, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "river stone apple"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert len({c["id"] for c in chunks}) == 1


def _long_body(render, stream):
    return {"model": "demo", "prompt": render("reverse: egg fish gold"), "max_tokens": 480, "temperature": 0,
            "stream": stream, "ignore_eos": True, "stop": None, "repetition_penalty": 1.0}


def test_streaming_client_disconnect_removes_the_row(server, render):
    body = _long_body(render, True)  # ignore_eos: 480 tokens, seconds of work if nobody stopped it
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as resp:
        for _, _line in zip(range(3), resp.iter_lines()):
            pass
        assert running(server.base_url) == 1
    # the connection is closed here; the row must leave promptly (not after 480 tokens)
    assert wait_for_running(server.base_url, 0, timeout=3.0) < 3.0


def test_non_streaming_client_disconnect_removes_the_row(server, render):
    body = _long_body(render, False)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=0.5)
    assert wait_for_running(server.base_url, 0, timeout=3.0) < 3.0
