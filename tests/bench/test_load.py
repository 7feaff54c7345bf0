"""The bench load generator: counts tokens and times the first one right, for aieng's stream format
and for transformers serve's, and measures a real server."""

import math

import pytest

from aieng.bench.load import percentile, plain_content_chunk, run_load
from aieng.bench.serve_bench import request_bodies

AIENG_MID = 'data: {"id":"c","object":"text_completion","created":1,"model":"demo","choices":[{"index":0,"text":" apple","logprobs":null,"finish_reason":null}]}'  # noqa: E501 (a real stream line)
AIENG_LAST = 'data: {"id":"c","object":"text_completion","created":1,"model":"demo","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]}'  # noqa: E501 (a real stream line)
AIENG_USAGE = 'data: {"id":"c","object":"text_completion","created":1,"model":"demo","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":32,"total_tokens":40}}'  # noqa: E501 (a real stream line)
PEER_MID = (
    'data: {"id":"9","choices":[{"index":0,"text":" apple"}],"created":1,"model":"/m","object":"text_completion"}'
)
PEER_LAST = 'data: {"id":"9","choices":[{"finish_reason":"length","index":0,"text":""}],"created":1,"model":"/m","object":"text_completion","usage":{"completion_tokens":8,"prompt_tokens":8,"total_tokens":16}}'  # noqa: E501 (a real stream line)
CHAT_ROLE = 'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'  # noqa: E501 (a real stream line)
ERROR = 'data: {"error":{"message":"out of memory","type":"server_error","param":null,"code":"out_of_memory"}}'


def test_only_plain_mid_stream_chunks_skip_parsing():
    assert plain_content_chunk(AIENG_MID) and plain_content_chunk(PEER_MID)
    for line in (AIENG_LAST, AIENG_USAGE, PEER_LAST, CHAT_ROLE, ERROR):
        assert not plain_content_chunk(line), line


def test_percentile_picks_the_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) in (50.0, 51.0) and percentile(values, 99) == 99.0
    assert math.isnan(percentile([], 50))


@pytest.fixture(scope="module")
def server(shared_server):
    """A real server, which these tests only read: the session's."""
    return shared_server


def test_load_against_a_real_server_counts_every_token(server, demo_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    result = run_load(server.base_url, request_bodies(tokenizer, "demo", 6, 12), concurrency=3)
    assert result.requests == 6 and result.ok == 6 and result.errors == 0
    assert result.mean_completion_tokens == 12  # ignore_eos: exactly max_tokens each
    assert 0 < result.ttft_p50_s <= result.latency_p50_s
    assert result.output_tok_per_s == pytest.approx(result.req_per_s * 12)


def test_load_reports_refused_requests_as_errors(server):
    bodies = [{"model": "demo", "prompt": "x", "max_tokens": 0, "stream": True}] * 2
    result = run_load(server.base_url, bodies, concurrency=2)
    assert result.ok == 0 and result.errors == 2 and result.status_counts == {"400": 2}


def test_each_server_gets_only_the_fields_it_accepts(demo_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    ours, peers = request_bodies(tokenizer, "demo", 2, 16), request_bodies(tokenizer, "/m", 2, 16, peer=True)
    assert all(b["ignore_eos"] and "generation_config" not in b for b in ours)
    assert all("ignore_eos" not in b and '"min_new_tokens": 16' in b["generation_config"] for b in peers)
    assert [b["prompt"] for b in ours] == [b["prompt"] for b in peers]
