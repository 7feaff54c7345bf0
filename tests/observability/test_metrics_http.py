"""Metrics over HTTP from a real 2-worker server (the session's): they add up across workers and every
name is there. A dead worker's gauges: tests/server/process/test_process_model.py, which kills one."""

import httpx
import psutil

from aieng.observability.scrape import scrape

from ..polling import poll

CONTRACT = [
    "aieng_request_duration_seconds_count",
    "aieng_time_to_first_token_seconds_count",
    "aieng_inter_token_latency_seconds_count",
    "aieng_queue_wait_seconds_count",
    "aieng_prefill_seconds_count",
    "aieng_decode_step_seconds_count",
    "aieng_batch_size_count",
    "aieng_requests_running",
    "aieng_requests_waiting",
    "aieng_tokens_per_second",
    "aieng_prompt_tokens_total",
    "aieng_generation_tokens_total",
    "aieng_requests_total",
    "aieng_request_errors_total",
    "aieng_requests_finished_total",
    "aieng_eos_early_total",
    "aieng_model_load_seconds_count",
    "aieng_model_load_errors_total",
    "aieng_model_info",
    "aieng_process_resident_memory_bytes",
    "aieng_host_memory_total_bytes",
    "aieng_host_memory_available_bytes",
    "aieng_queue_capacity",
    "aieng_tokens_per_second_baseline",
    "aieng_output_tokens_count",
    "aieng_client_aborts_total",
    "aieng_step_tokens_count",
    "aieng_kv_cache_rows_used",
    "aieng_kv_cache_rows_total",
    "aieng_kv_cache_tokens_used",
    "aieng_kv_cache_tokens_total",
    "aieng_kv_cache_full_steps_total",
    "aieng_slo_e2e_p99_seconds",
]


def test_counters_add_up_across_two_workers_and_every_name_is_exported(two_workers):
    master = psutil.Process(two_workers.process.pid)
    assert len(master.children()) == 2
    n = 40
    body = {
        "model": "demo",
        "prompt": "<|bos|><|user|>add: 22+22<|end|><|assistant|>",
        "max_tokens": 4,
        "temperature": 0,
    }
    with httpx.Client(base_url=two_workers.base_url, timeout=30) as client:
        before = scrape(two_workers.base_url).value("aieng_requests_total", route="/v1/completions")
        statuses = [client.post("/v1/completions", json=body).status_code for _ in range(n)]
        client.post("/v1/completions", json={**body, "temperature": -1})  # one error, for the error counter
    assert statuses == [200] * n
    snap = scrape(two_workers.base_url)
    assert snap.value("aieng_requests_total", route="/v1/completions") - before == n + 1
    assert snap.value("aieng_requests_total", route="/v1/completions", code="400") >= 1
    assert snap.value("aieng_request_errors_total", code="invalid_parameter") >= 1
    missing = [name for name in CONTRACT if name not in snap.names()]
    assert not missing, missing
    # sensible values
    assert snap.value("aieng_time_to_first_token_seconds_count") >= n
    assert snap.value("aieng_generation_tokens_total") >= n
    assert snap.value("aieng_requests_finished_total") >= n
    assert 0 < snap.quantile("aieng_time_to_first_token_seconds", 0.5) < 5
    per_worker = {
        dict(labels)["pid"]: value
        for (name, labels), value in snap.samples.items()
        if name == "aieng_model_info" and dict(labels)["version"] == "1"
    }
    assert len(per_worker) == 2 and set(per_worker.values()) == {
        1.0
    }  # one sample per live worker, none from the master
    assert snap.value("aieng_queue_capacity") == 2 * 256  # one queue per worker
    rss = snap.value("aieng_process_resident_memory_bytes")
    assert 50 * 2**20 < rss < 8 * 2**30
    total, available = snap.value("aieng_host_memory_total_bytes"), snap.value("aieng_host_memory_available_bytes")
    assert 0 < available <= total, "a process that never read host memory must not count as 0 bytes free"


def test_output_lengths_aborts_by_phase_kv_occupancy_and_the_slo_are_exported(two_workers):
    """The operations signals: tokens per finished request, a client that leaves mid-stream counted
    in the decode phase, KV rows and tokens against what the engines hold, the e2e objective, and
    model loads by version."""
    url = two_workers.base_url
    before = scrape(url)
    body = {"model": "demo", "prompt": "<|bos|><|user|>reverse: abcdef<|end|><|assistant|>", "temperature": 0}
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(4):
            assert client.post("/v1/completions", json={**body, "max_tokens": 6}).status_code == 200
        long = {**body, "max_tokens": 400, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/v1/completions", json=long) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: {"):
                    break  # the first token arrived: leave in the decode phase

    def aborted() -> float:
        return scrape(url).value("aieng_client_aborts_total", phase="decode") - before.value(
            "aieng_client_aborts_total", phase="decode"
        )

    assert poll(lambda: aborted() >= 1, timeout=30, poll_s=0.2)
    after = scrape(url)
    finished = after.value("aieng_output_tokens_count") - before.value("aieng_output_tokens_count")
    assert finished >= 4 and 0 < after.quantile("aieng_output_tokens", 0.5) <= 8
    assert after.value("aieng_client_aborts_total", phase="queued") == before.value(
        "aieng_client_aborts_total", phase="queued"
    )
    assert after.value("aieng_step_tokens_count") > before.value("aieng_step_tokens_count")
    rows_total, tokens_total = after.value("aieng_kv_cache_rows_total"), after.value("aieng_kv_cache_tokens_total")
    assert rows_total >= 2 and tokens_total == rows_total * 512  # both workers' engines, demo context 512
    assert 0 <= after.value("aieng_kv_cache_rows_used") <= rows_total
    assert after.value("aieng_slo_e2e_p99_seconds") == 30.0  # AIENG_SLO_E2E_P99_S's default
    assert after.value("aieng_model_load_seconds_count", model="demo", version="1") >= 1
