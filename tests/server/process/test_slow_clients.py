"""Slow and vanishing clients against the real server, over raw sockets where HTTP libraries
would be too polite: slow headers and bodies are cut, a worker's connection cap answers 503 in
the error envelope, 500 streams that vanish leave no row behind, a reader that never reads does
not slow anyone else, and a stream's unread tokens are bounded. The strict limits are a process
setting (``strict_server``); what needs no setting runs on the session's server."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import struct
import threading
import time

import httpx
import pytest

from aieng.bench.server_process import ServerProcess

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def strict_server(demo_store):
    """One worker with tight limits: 1 s for headers and body, 8 connections."""
    env = {
        "AIENG_HEADER_TIMEOUT_S": "1",
        "AIENG_BODY_TIMEOUT_S": "1",
        "AIENG_MAX_CONNECTIONS": "8",
        "AIENG_RELOAD_POLL_S": "0",
    }
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "1", "--no-compile"], env=env) as proc:
        yield proc


def _connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


def _read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_headers_that_never_finish_are_cut_with_408(strict_server):
    silent, trickle = _connect(strict_server), _connect(strict_server)
    trickle.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    started = time.monotonic()
    for sock in (silent, trickle):
        status, headers, body = _read_response(sock)
        assert status == 408 and headers["connection"] == "close"
        assert json.loads(body)["error"]["code"] == "request_timeout"
    assert 0.9 < time.monotonic() - started < 5
    assert "slow_client" in strict_server.output()


def test_a_body_that_never_finishes_is_cut_with_408(strict_server):
    sock = _connect(strict_server)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 200\r\n\r\n{"model": "demo"'
    )  # 16 of 200 bytes
    status, _, body = _read_response(sock)
    error = json.loads(body)["error"]
    assert status == 408 and error["code"] == "request_timeout" and "16 bytes came" in error["message"]
    assert httpx.get(f"{strict_server.base_url}/health/ready", timeout=5).status_code == 200


def test_beyond_the_connection_cap_a_worker_answers_503_in_the_envelope(strict_server):
    idle = [_connect(strict_server) for _ in range(8)]
    try:
        time.sleep(0.2)
        resp = httpx.get(f"{strict_server.base_url}/v1/models", timeout=5)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "too_many_connections"
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(f"{strict_server.base_url}/v1/models", timeout=5).status_code == 200


def _gauges(base_url) -> tuple[float, float]:
    from aieng.observability.scrape import scrape

    snapshot = scrape(base_url)
    return snapshot.value("aieng_requests_running"), snapshot.value("aieng_requests_waiting")


async def _vanish(host: str, port: int, body: bytes) -> bool:
    """Open a stream, read until its first token (the second event: the first only names the
    role), then reset the connection (no FIN, no goodbye)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    got, events = False, 0
    try:
        async with asyncio.timeout(60):
            while line := await reader.readline():
                events += line.startswith(b"data:")
                if events == 2 or line.startswith(b"HTTP/1.1 429"):
                    got = True
                    break
    except TimeoutError:
        pass
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    writer.transport.abort()
    return got


def test_500_streams_that_vanish_mid_way_leave_no_row_behind(shared_server):
    body = json.dumps(
        {
            "model": "demo",
            "messages": [{"role": "user", "content": "reverse: a b c d e f g h"}],
            "max_tokens": 200,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()

    async def storm() -> list[bool]:
        results = []
        for _start in range(0, 500, 50):  # waves of 50, so the storm is 500 distinct connections
            results += await asyncio.gather(*(_vanish(shared_server.host, shared_server.port, body) for _ in range(50)))
        return results

    answered = asyncio.run(storm())
    assert sum(answered) >= 450, f"only {sum(answered)} of 500 streams began"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _gauges(shared_server.base_url) != (0, 0):
        time.sleep(0.3)
    assert _gauges(shared_server.base_url) == (0, 0), "rows or queued requests outlived their vanished clients"
    ok = httpx.post(
        f"{shared_server.base_url}/v1/completions",
        timeout=30,
        json={"model": "demo", "prompt": "add: 1+1", "max_tokens": 4, "temperature": 0},
    )
    assert ok.status_code == 200


def _timed_streams(base_url: str, clients: int, rounds: int) -> list[float]:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "reverse: egg fish gold"}],
        "max_tokens": 64,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    times: list[float] = []

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            for _ in range(rounds):
                start = time.perf_counter()
                with http.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
                    for _ in resp.iter_lines():
                        pass
                times.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


@pytest.mark.perf  # a latency bound: the stalled reader must not slow the other streams
def test_a_reader_that_never_reads_does_not_slow_the_others(shared_server):
    baseline = statistics.median(_timed_streams(shared_server.base_url, 4, 4))
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    stalled.connect((shared_server.host, shared_server.port))
    body = json.dumps(
        {"model": "demo", "prompt": "reverse: a b c", "max_tokens": 480, "stream": True, "ignore_eos": True}
    ).encode()
    stalled.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )  # then never reads a byte
    try:
        with_stalled = statistics.median(_timed_streams(shared_server.base_url, 4, 4))
    finally:
        stalled.close()
    # the stalled row decodes beside the others like any row; it never makes the engine wait
    assert with_stalled < 2.0 * baseline + 0.05, (baseline, with_stalled)


def test_a_stream_whose_tokens_pile_up_unread_is_cancelled_past_the_bound(caplog):
    from aieng.engine import GenerationRequest, SamplingParams, TokenEvent
    from aieng.scheduler import Scheduler
    from aieng.server.http.bridge import Bridge

    scheduler = Scheduler()
    bridge = Bridge(scheduler, metrics_enabled=False, buffer_events=3)

    async def scenario():
        submission = bridge.submit(
            GenerationRequest("r1", [1, 2], SamplingParams(max_tokens=50)), priority="interactive", timeout=None
        )
        for i in range(6):  # the engine thread's deliveries, nobody reading
            submission.queued.sink(TokenEvent("r1", i, f"t{i}"))
        await asyncio.sleep(0.01)  # the mailbox hands them to the request's queue
        return [event async for event in bridge.events(submission)]

    events = asyncio.run(scenario())
    assert [e.text for e in events[:3]] == ["t0", "t1", "t2"]  # what fitted is still delivered, in order
    assert events[-1].finished and events[-1].error.code == "client_too_slow" and len(events) == 4
    assert "r1" in scheduler._cancelled  # the row leaves the batch at the next step
    assert any(getattr(r, "event", None) == "slow_client" and r.phase == "stream" for r in caplog.records)


def test_a_chunked_body_over_the_limit_is_413_not_a_parse_error(strict_server):
    def chunks():  # no Content-Length: the limit can only be seen while reading
        for _ in range(12):
            yield b"x" * 100_000

    resp = httpx.post(
        f"{strict_server.base_url}/v1/completions",
        content=chunks(),
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"
