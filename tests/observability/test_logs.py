"""JSON log lines keyed by trace id, over a real server (the session's); payload sampling on the
served app in-process."""

import json
import logging

import httpx

from ..polling import poll

TRACE = "0af7651916cd43dd8448eb211c80319c"


def lines(proc):
    return [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]


def wait_for(found, timeout: float = 10.0) -> list:
    """``found()`` once it is not empty (or empty after ``timeout``): a request's last lines are
    written as its response ends, and reach the log file a moment later."""
    return poll(found, timeout)


def test_every_stderr_line_is_json_with_the_contract_fields(two_workers):
    httpx.get(f"{two_workers.base_url}/health/ready")
    # a prompt past the model's length: transformers warns about it, in a JSON line like the rest
    too_long = httpx.post(f"{two_workers.base_url}/v1/completions", json={"model": "demo", "prompt": "apple " * 600})
    assert too_long.status_code == 400
    raw = [line for line in two_workers.output().splitlines() if line.strip()]
    parsed = [json.loads(line) for line in raw if line.startswith("{")]
    assert len(parsed) == len(raw), [line for line in raw if not line.startswith("{")][:3]
    assert all({"ts", "level", "event", "trace_id", "request_id", "model", "version"} <= set(p) for p in parsed)


def test_traceparent_is_echoed_and_follows_the_request(two_workers):
    resp = httpx.post(
        f"{two_workers.base_url}/v1/completions",
        timeout=30,
        headers={"traceparent": f"00-{TRACE}-b7ad6b7169203331-01", "X-Request-ID": "req-42"},
        json={"model": "demo", "prompt": "<|bos|><|user|>add: 11+11<|end|><|assistant|>", "max_tokens": 4},
    )
    assert resp.headers["x-trace-id"] == TRACE and resp.headers["x-request-id"] == "req-42"
    finished = wait_for(
        lambda: [
            line for line in lines(two_workers) if line["trace_id"] == TRACE and line["event"] == "request_finished"
        ]
    )
    assert len(finished) == 1
    line = finished[0]
    assert line["request_id"] == "req-42" and line["model"] == "demo" and line["version"] == "1"
    assert {
        "queue_s",
        "prefill_s",
        "decode_s",
        "total_s",
        "prompt_tokens",
        "completion_tokens",
        "finish_reason",
    } <= set(line)
    assert "prompt" not in line and "output" not in line  # payloads are not logged by default


def test_generated_trace_id_when_no_header(two_workers):
    resp = httpx.get(f"{two_workers.base_url}/v1/models")
    assert len(resp.headers["x-trace-id"]) == 32 and resp.headers["x-trace-id"] == resp.headers["x-request-id"]


def test_engine_thread_lines_carry_the_trace_id(two_workers):
    trace = "1" * 32
    resp = httpx.post(
        f"{two_workers.base_url}/v1/completions",
        timeout=30,
        headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"},
        json={
            "model": "demo",
            "prompt": "<|bos|><|user|>add: 11+11<|end|><|assistant|>",
            "max_tokens": 400,
            "ignore_eos": True,
            "timeout": 0.05,
        },
    )
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "timeout"
    ours = wait_for(
        lambda: [
            line for line in lines(two_workers) if line["event"] == "request_timeout" and line["trace_id"] == trace
        ]
    )
    assert any(line["logger"] == "aieng.scheduler" for line in ours), ours


def test_payload_sampling_logs_prompt_and_output(inprocess, session_store, caplog):
    """AIENG_LOG_PAYLOAD_SAMPLE=1.0: every request_finished line carries the prompt and the output
    (the app in this process; its log records are read as they are made)."""
    sampled = inprocess(session_store.root, log_payload_sample=1.0)
    caplog.set_level(logging.INFO, logger="aieng.request")
    sampled.post(
        "/v1/completions",
        headers={"X-Request-ID": "sampled-1"},
        json={
            "model": "demo",
            "prompt": "<|bos|><|user|>add: 23+32<|end|><|assistant|>",
            "max_tokens": 4,
            "temperature": 0,
        },
    )
    finished = wait_for(lambda: [r for r in caplog.records if getattr(r, "event", None) == "request_finished"])
    assert finished, "no request_finished line"
    assert finished[-1].prompt.endswith("<|assistant|>") and finished[-1].output == "55"


def test_errors_keep_tracebacks_server_side(two_workers):
    resp = httpx.post(f"{two_workers.base_url}/v1/completions", json={"model": "demo", "prompt": ["a", "b"]})
    assert resp.status_code == 400 and "Traceback" not in resp.text


def test_step_lines_are_sampled_at_debug_level_and_silent_above_it(caplog):
    from aieng.engine.request import StepResult
    from aieng.observability.observer import StepLog

    steps = StepLog(every=3, version="7")
    step = StepResult(prefill_s=0.002, decode_s=0.004, decoded_rows=5, prefill_tokens=64, kv_rows=6, kv_rows_total=8)
    with caplog.at_level(logging.INFO, logger="aieng.engine.steps"):
        for _ in range(6):
            steps.on_step(step, running=6, waiting=2, now=0.0)
    assert not [r for r in caplog.records if r.name == "aieng.engine.steps"]
    with caplog.at_level(logging.DEBUG, logger="aieng.engine.steps"):
        for _ in range(6):
            steps.on_step(step, running=6, waiting=2, now=0.0)
    lines = [r for r in caplog.records if r.name == "aieng.engine.steps"]
    assert [r.step for r in lines] == [9, 12]  # one in every 3 steps
    line = lines[0]
    assert (line.event, line.version, line.prefill_tokens, line.decode_rows, line.kv_rows, line.kv_rows_total) == (
        "engine_step",
        "7",
        64,
        5,
        6,
        8,
    )
    assert line.step_ms == 6.0 and (line.running, line.waiting) == (6, 2)
