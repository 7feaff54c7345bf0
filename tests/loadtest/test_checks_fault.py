"""The post-run checks fail, each by name, against a server that leaks, errs, lies or sticks.

The faulty server is a test double (a leak or a stuck row cannot be produced on demand in the
real one): a small OpenAI-compatible streaming app with aieng's metric names, run by uvicorn on
a free loopback port. Its capacity is two requests at a time, so a rate sweep saturates it at a
known rate.
"""

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from aieng.bench.server_process import free_port
from aieng.loadtest.checks import CheckLimits
from aieng.loadtest.run import LoadTest, run_loadtest
from aieng.loadtest.workload import parse_workload

WORKLOAD = {
    "name": "tiny",
    "duration_s": 1,
    "warmup_s": 0.3,
    "cooldown_s": 0.2,
    "arrival": {"process": "constant", "rate": 40},
    "classes": [
        {"name": "short", "share": 0.5, "max_tokens": 3, "family": ["add"]},
        {"name": "long", "share": 0.5, "max_tokens": 6, "text": "reverse: a b c", "exact_tokens": True},
    ],
}


def double(*, fail_every=0, leak=0, stuck=False, miscount=0, seconds_per_request=0.01, busy_every=0):
    app = FastAPI()
    state = {"n": 0, "ok": 0, "errors": 0, "tokens": 0, "rss": 100 * 2**20}
    capacity = asyncio.Semaphore(2)

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "demo"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        state["n"] += 1
        state["rss"] += leak
        if busy_every and state["n"] % busy_every == 0:  # overloaded: come back in 0.1 s
            return JSONResponse({"error": {"message": "busy"}}, status_code=429, headers={"Retry-After": "0.1"})
        if fail_every and state["n"] % fail_every == 0:
            state["errors"] += 1
            return JSONResponse({"error": {"message": "injected"}}, status_code=500)
        state["ok"] += 1
        tokens = body["max_tokens"]
        state["tokens"] += tokens + miscount

        async def stream():
            async with capacity:
                for _i in range(tokens):
                    await asyncio.sleep(seconds_per_request / tokens)
                    yield f"data: {json.dumps({'choices': [{'delta': {'content': 'x'}, 'finish_reason': None}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': {'prompt_tokens': 4, 'completion_tokens': tokens}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.get("/metrics")
    def metrics():
        route = 'route="/v1/chat/completions",version="1"'
        return PlainTextResponse(
            f'aieng_requests_total{{{route},code="200"}} {state["ok"]}\n'
            f'aieng_requests_total{{{route},code="500"}} {state["errors"]}\n'
            f'aieng_generation_tokens_total{{version="1"}} {state["tokens"]}\n'
            f"aieng_process_resident_memory_bytes {state['rss']}\n"
            f"aieng_requests_running {1 if stuck else 0}\naieng_requests_waiting 0\n"
        )

    return app


@pytest.fixture
def serve():
    servers = []

    def start(app) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def checks_of(url, tmp_path, **options):
    data = run_loadtest(
        LoadTest(url=url, workload=parse_workload(WORKLOAD), out=tmp_path, progress=False, **options),
        log=lambda line: None,
    )
    return data, {c["name"]: c["passed"] for c in data["checks"]}


def test_a_healthy_double_passes_every_check(serve, tmp_path):
    data, checks = checks_of(serve(double()), tmp_path)
    assert checks == {"rss_growth": True, "metrics_agree": True, "idle_after": True, "error_rate": True}
    assert data["passed"] and data["levels"][0]["summary"]["all"]["requests"] >= 20
    assert set(data["levels"][0]["summary"]["classes"]) == {"short", "long"}


def test_a_leaking_erring_stuck_or_miscounting_server_fails_the_check_named(serve, tmp_path):
    leaky = serve(double(leak=2**20, fail_every=5, stuck=True))  # 1 MiB per request, every fifth a 500
    data, checks = checks_of(leaky, tmp_path / "leaky", limits=CheckLimits(max_error_rate=0.05, idle_timeout_s=0.5))
    assert checks == {"rss_growth": False, "metrics_agree": True, "idle_after": False, "error_rate": False}
    assert not data["passed"]
    assert data["levels"][0]["summary"]["all"]["errors_by_status"] == {
        "500": pytest.approx(data["levels"][0]["summary"]["all"]["failed"])
    }
    _, checks = checks_of(serve(double(miscount=1)), tmp_path / "liar")  # counts a token per request too many
    assert checks["metrics_agree"] is False and checks["error_rate"] is True


def test_a_sweep_finds_the_knee_of_a_server_with_known_capacity(serve, tmp_path):
    # two at a time, 0.1 s each: at most 20 requests per second
    url = serve(double(seconds_per_request=0.1))
    workload = parse_workload({**WORKLOAD, "sweep": {"rates": [8, 16, 32], "duration_s": 1}})
    data = run_loadtest(
        LoadTest(
            url=url, workload=workload, out=tmp_path, sweep=True, progress=False, slos={"e2e": 1.0}, target_rps=50
        ),
        log=lambda line: None,
    )
    knee = data["saturation"]
    assert knee is not None and knee["offered_rps"] > 20 >= knee["throughput_rps"] * 0.9, knee
    plan = data["capacity"]
    assert plan["per_replica_rps"] is not None and plan["per_replica_rps"] <= 20 and plan["replicas"] >= 3, plan
    for name in ("latency_vs_rate", "throughput_vs_rate", "ttft_cdf", "tokens_over_time"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "report.html").read_text()
    assert "Saturation:" in html and "replica" in html and html.count("data:image/png;base64,") == 4
    assert json.loads((tmp_path / "results.json").read_text())["schema"] == "aieng.loadtest/1"


def test_429s_are_counted_or_waited_out_as_their_retry_after_says(serve, tmp_path):
    url = serve(double(busy_every=4))  # every fourth request (retries included) is refused for 0.1 s
    counted, _ = checks_of(url, tmp_path / "counted")
    a = counted["levels"][0]["summary"]["all"]
    assert a["rate_limited"] == a["failed"] > 0 and a["errors_by_status"] == {"429": a["failed"]}
    honoured, _ = checks_of(url, tmp_path / "honoured", honour_retry_after=True)
    b = honoured["levels"][0]["summary"]["all"]
    assert b["failed"] == 0 and b["retried_after_429"] > 0
    assert b["e2e_s"]["p99"] >= 0.1  # the wait counts in the latency of the request that waited
