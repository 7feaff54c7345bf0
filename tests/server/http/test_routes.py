"""The walking-skeleton routes, in-process: ``create_app`` on a runtime built in this process,
over httpx's ASGI transport (``inprocess_demo``, tests/conftest.py). The middleware, the error
envelope and the engine thread are the served ones; what needs a socket (SSE framing on the
wire, disconnects, the process model) is tested against a real server elsewhere."""

import json

import pytest


@pytest.fixture(scope="module")
def client(inprocess_demo):
    return inprocess_demo


def test_health_routes(client):
    assert client.get("/health/live").json() == {"status": "alive"}
    ready = client.get("/health/ready")
    assert ready.status_code == 200 and ready.json()["model"] == "demo" and ready.json()["version"] == "1"
    health = client.get("/health")  # vLLM's and TGI's name for readiness, probed by load-test tools
    assert health.status_code == 200 and health.json() == ready.json()


def test_models_lists_the_served_version(client):
    body = client.get("/v1/models").json()
    assert body["object"] == "list"
    assert [(m["id"], m["version"]) for m in body["data"]] == [("demo", "1")]


def test_completion_returns_the_demo_models_answer(client, render):
    resp = client.post(
        "/v1/completions",
        json={"model": "demo", "prompt": render("reverse: apple stone river"), "max_tokens": 16, "temperature": 0},
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "text_completion" and body["model"] == "demo"
    choice = body["choices"][0]
    assert choice["text"].strip() == "river stone apple"
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 3 and 0 < usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_max_tokens_cut_gives_finish_reason_length(client, render):
    resp = client.post(
        "/v1/completions",
        json={"model": "demo", "prompt": render("json: name=ana age=31"), "max_tokens": 1, "temperature": 0},
    )
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert resp.json()["usage"]["completion_tokens"] == 1
    phases = [part.split(";")[0] for part in resp.headers["server-timing"].split(", ")]
    assert phases == ["queue", "prefill", "decode"]


def test_request_id_is_echoed_and_process_time_reported(client):
    resp = client.get("/v1/models", headers={"X-Request-ID": "trace-abc-123"})
    assert resp.headers["x-request-id"] == "trace-abc-123"
    assert float(resp.headers["x-process-time"]) >= 0
    generated = client.get("/health/live").headers["x-request-id"]
    assert len(generated) == 32


def _error(resp, status):
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(
    "field,value,fragment",
    [
        ("temperature", -1, "temperature must be >= 0"),
        ("top_p", 0, "top_p must be > 0"),
        ("top_k", -3, "top_k must be >= 0"),
        ("max_tokens", 0, "max_tokens must be >= 1"),
        ("stop", ["a", "b", "c", "d", "e"], "at most 4 stop strings"),
        ("presence_penalty", 2.5, "between -2 and 2"),
        ("frequency_penalty", -3, "between -2 and 2"),
        ("logit_bias", {"7": 101}, "between -100 and 100"),
        ("logit_bias", {"seven": 1}, "token ids"),
        ("logit_bias", {"999999": 1}, "does not have"),
    ],
)
def test_invalid_parameters_get_one_precise_message(client, field, value, fragment):
    error = _error(client.post("/v1/completions", json={"model": "demo", "prompt": "hi", field: value}), 400)
    assert fragment in error["message"] and error["param"] == field


def test_wrong_types_name_the_field_with_400(client):
    error = _error(client.post("/v1/completions", json={"model": "demo", "prompt": "hi", "max_tokens": "many"}), 400)
    assert error["param"] == "max_tokens" and "max_tokens" in error["message"]
    error = _error(client.post("/v1/completions", json={"model": "demo"}), 400)
    assert error["param"] == "prompt" and "missing" in error["message"]


@pytest.mark.parametrize(
    "field,value",
    [
        ("stream", "yes"),
        ("stream", 1),
        ("max_tokens", "16"),
        ("max_tokens", 16.0),
        ("temperature", "0.5"),
        ("temperature", True),
        ("seed", "7"),
        ("echo", "true"),
        ("stop", 3),
        ("logprobs", True),
        ("prompt", 42),
    ],
)
def test_types_are_strict_as_openai_s(client, field, value):
    """OpenAI refuses a value of the wrong type instead of coercing it: "yes" is not true, "16" not 16."""
    error = _error(client.post("/v1/completions", json={"model": "demo", "prompt": "add: 2+3", field: value}), 400)
    assert error["param"] is not None and error["param"].split(".")[0] == field, error


def test_an_integer_is_a_number(client):
    resp = client.post(
        "/v1/completions", json={"model": "demo", "prompt": "add: 2+3", "max_tokens": 2, "temperature": 0, "top_p": 1}
    )
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    "body",
    [
        {"model": "demo", "prompt": "add: 2+3\ud800"},
        {"model": "demo", "prompt": ["\udfff"]},
        {"model": "demo", "prompt": "add: 2+3", "stop": ["\ud83d"]},
        {"model": "demo", "messages": [{"role": "user", "content": "hi \ud800"}]},
        {"model": "demo", "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
    ],
)
def test_a_lone_surrogate_is_a_400_not_a_tokenizer_crash(client, body):
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as the escape \\ud800, as a client sends it
    error = _error(client.post(route, content=raw, headers={"content-type": "application/json"}), 400)
    assert "surrogate" in error["message"]
    assert client.get("/health/ready").status_code == 200


def test_content_parts_other_than_text_are_refused(client):
    error = _error(
        client.post(
            "/v1/chat/completions",
            json={
                "model": "demo",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
                ],
            },
        ),
        400,
    )
    assert error["param"].startswith("messages.0.content")
    resp = client.post(
        "/v1/chat/completions",
        json={
            "model": "demo",
            "max_tokens": 4,
            "temperature": 0,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "add: "}, {"type": "text", "text": "27+58"}]},
            ],
        },
    )
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "85", resp.text


def test_unknown_fields_are_ignored(client):
    resp = client.post(
        "/v1/completions",
        json={
            "model": "demo",
            "prompt": "add: 23+32",
            "max_tokens": 2,
            "temperature": 0,
            "frobnicate": True,
            "user": "x",
        },
    )
    assert resp.status_code == 200


def test_invalid_json_and_empty_prompt(client):
    error = _error(
        client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"}), 400
    )
    assert "JSON" in error["message"]
    error = _error(client.post("/v1/completions", json={"model": "demo", "prompt": ""}), 400)
    assert error["param"] == "prompt"


def test_unknown_model_is_404(client):
    error = _error(client.post("/v1/completions", json={"model": "gpt-9", "prompt": "hi"}), 404)
    assert error["code"] == "model_not_found" and "demo" in error["message"]


def test_prompt_too_long_is_context_length_exceeded(client):
    error = _error(
        client.post("/v1/completions", json={"model": "demo", "prompt": "apple " * 600, "max_tokens": 16}), 400
    )
    assert error["code"] == "context_length_exceeded"
    assert "512" in error["message"] and "requested" in error["message"]


def test_body_over_the_limit_is_413(client):
    error = _error(client.post("/v1/completions", json={"model": "demo", "prompt": "x" * 1_200_000}), 413)
    assert error["code"] == "request_too_large"


def test_unknown_route_uses_the_envelope(client):
    assert _error(client.get("/v1/nope"), 404)["code"] == "not_found"


def test_server_stays_healthy_after_bad_requests(client):
    client.post("/v1/completions", json={"model": "demo", "prompt": "apple " * 600})
    assert client.get("/health/ready").status_code == 200


def test_metrics_report_the_model_load(client):
    text = client.get("/metrics").text
    assert "aieng_model_load_seconds_count" in text
    assert 'aieng_model_info{name="demo"' in text


def test_a_repeated_prefix_is_read_from_the_prefix_cache_and_counted(client, render):
    """Two chat requests with one long system message: the second's usage says how many prompt
    tokens came from the cache, and /metrics counts them (as hit) and what free rows keep."""
    from aieng.observability.scrape import parse

    def prefix_counts():
        samples = parse(client.get("/metrics").text).samples
        return {
            "hit": samples.get(("aieng_prefix_cache_tokens_total", (("result", "hit"),)), 0),
            "miss": samples.get(("aieng_prefix_cache_tokens_total", (("result", "miss"),)), 0),
            "kept": samples.get(("aieng_prefix_cache_kept_tokens", ()), 0),
        }

    system = "context: " + " ".join(["apple stone river moon sun"] * 10)
    before = prefix_counts()
    usages = []
    for question in ("reverse: apple stone river", "sort: river apple stone"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        body = {"model": "demo", "messages": messages, "max_tokens": 4, "temperature": 0}
        resp = client.post("/v1/chat/completions", json=body)
        assert resp.status_code == 200, resp.text
        usages.append(resp.json()["usage"])
    first, second = usages
    assert first["prompt_tokens_details"]["cached_tokens"] < 10  # at most a chat template's opening
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert 50 < cached < second["prompt_tokens"]
    after = prefix_counts()
    assert after["hit"] - before["hit"] >= cached
    assert (
        after["hit"] + after["miss"] - before["hit"] - before["miss"]
        == first["prompt_tokens"] + second["prompt_tokens"]
    )
    assert after["kept"] > 0
