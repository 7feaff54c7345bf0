"""Conformance from outside: schemathesis generates requests from the server's own /openapi.json,
valid ones and deliberately broken ones, for every operation. None may get a 5xx, and every
error must come in OpenAI's envelope. Bounded (``EXAMPLES`` per operation and mode, derandomized
so a failure reproduces) to keep ``make test`` fast."""

import json

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck

EXAMPLES = 30


@pytest.fixture(scope="module")
def api(server):
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")


def check(response, body) -> None:
    # A 504 is the answer to the request's own `timeout` (an extension: seconds until it is abandoned),
    # which the generator sets to anything > 0, say 1e-300: not a server error.
    asked_for_a_deadline = isinstance(body, dict) and isinstance(body.get("timeout"), (int, float))
    if response.status_code == 504 and asked_for_a_deadline:
        assert json.loads(response.text)["error"]["code"] == "timeout"
        return
    assert response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error


POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
CASES = [
    (label, mode) for label in ("POST /v1/completions", "POST /v1/chat/completions") for mode in (POSITIVE, NEGATIVE)
]
CASES += [(label, POSITIVE) for label in ("GET /v1/models", "GET /health/ready", "GET /metrics")]  # no input to break


@pytest.mark.parametrize("label,mode", CASES, ids=lambda x: getattr(x, "value", x))
def test_no_server_errors_and_every_error_in_the_envelope(api, server, label, mode):
    method, path = label.split(" ")
    strategy = api[path][method].as_strategy(generation_mode=mode)
    seen: list[int] = []

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.generate],
    )
    @hypothesis.given(case=strategy)
    def run(case):
        if mode is POSITIVE and isinstance(case.body, dict):
            case.body["model"] = "demo"  # a random model name would only ever meet the 404
        response = case.call(base_url=server.base_url, timeout=60)
        seen.append(response.status_code)
        check(response, case.body)

    run()
    assert seen, "no request was generated"
    if mode is NEGATIVE:
        assert any(400 <= code < 500 for code in seen)  # the broken requests were refused, not served
