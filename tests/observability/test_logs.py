"""JSON log lines keyed by trace id, over a real server."""

import json
import time

import httpx
import pytest

from aieng.bench.server_process import ServerProcess

TRACE = "0af7651916cd43dd8448eb211c80319c"


def lines(proc):
    return [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def sampled_server(demo_store):
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "1"],
                       env={"AIENG_LOG_PAYLOAD_SAMPLE": "1.0"}) as proc:
        yield proc


def test_every_stderr_line_is_json_with_the_contract_fields(two_workers):
    httpx.get(f"{two_workers.base_url}/health/ready")
    raw = [line for line in two_workers.output().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in raw if line.startswith("{")]
    assert len(parsed) == len(raw), [line for line in raw if not line.startswith("{")][:3]
    assert all({"ts", "level", "event", "trace_id", "request_id", "model", "version"} <= set(p) for p in parsed)


def test_traceparent_is_echoed_and_follows_the_request(two_workers):
    resp = httpx.post(f"{two_workers.base_url}/v1/completions", timeout=30,
                      headers={"traceparent": f"00-{TRACE}-b7ad6b7169203331-01", "X-Request-ID": "req-42"},
                      json={"model": "demo", "prompt": "<|bos|><|user|>add: 11+11<|end|><|assistant|>", "max_tokens": 4})
    assert resp.headers["x-trace-id"] == TRACE and resp.headers["x-request-id"] == "req-42"
    time.sleep(0.3)
    ours = [line for line in lines(two_workers) if line["trace_id"] == TRACE]
    finished = [line for line in ours if line["event"] == "request_finished"]
    assert len(finished) == 1
    line = finished[0]
    assert line["request_id"] == "req-42" and line["model"] == "demo" and line["version"] == "1"
    assert {"queue_s", "prefill_s", "decode_s", "total_s", "prompt_tokens", "completion_tokens", "finish_reason"} <= set(line)
    assert "prompt" not in line and "output" not in line  # payloads are not logged by default


def test_generated_trace_id_when_no_header(two_workers):
    resp = httpx.get(f"{two_workers.base_url}/v1/models")
    assert len(resp.headers["x-trace-id"]) == 32 and resp.headers["x-trace-id"] == resp.headers["x-request-id"]


def test_engine_thread_lines_carry_the_trace_id(two_workers):
    trace = "1" * 32
    resp = httpx.post(f"{two_workers.base_url}/v1/completions", timeout=30,
                      headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"},
                      json={"model": "demo", "prompt": "<|bos|><|user|>add: 11+11<|end|><|assistant|>", "max_tokens": 400,
                            "ignore_eos": True, "timeout": 0.05})
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "timeout"
    time.sleep(0.3)
    timeout_lines = [line for line in lines(two_workers) if line["event"] == "request_timeout"]
    assert any(line["trace_id"] == trace and line["logger"] == "aieng.scheduler" for line in timeout_lines)


def test_payload_sampling_logs_prompt_and_output(sampled_server):
    trace = "2" * 32
    httpx.post(f"{sampled_server.base_url}/v1/completions", timeout=30,
               headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"},
               json={"model": "demo", "prompt": "<|bos|><|user|>add: 23+32<|end|><|assistant|>", "max_tokens": 4,
                     "temperature": 0})
    time.sleep(0.3)
    line = next(line for line in lines(sampled_server) if line["trace_id"] == trace and line["event"] == "request_finished")
    assert line["prompt"].endswith("<|assistant|>") and line["output"] == "55"


def test_errors_keep_tracebacks_server_side(two_workers):
    resp = httpx.post(f"{two_workers.base_url}/v1/completions", json={"model": "demo", "prompt": ["a", "b"]})
    assert resp.status_code == 400 and "Traceback" not in resp.text
