"""``admin_reload`` against a loopback HTTP server that answers as a worker does: a busy worker
(still starting, or mid-swap: 503 with Retry-After) is asked again until it answers, a refusal
(409) is final at once, and a worker busy past the timeout is a ReloadError that says so."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from aieng.errors import ReloadError
from aieng.release.reload import admin_reload

BUSY = (503, {"status": "busy", "previous": None, "version": None, "error": "the worker is still starting"})
SWAPPED = (200, {"status": "swapped", "previous": "1", "version": "2", "error": None})
FAILED = (409, {"status": "failed", "previous": "1", "version": "2", "error": "weights do not fit the config"})


@pytest.fixture
def worker():
    """A server that plays back ``answers`` in order (the last one repeats) and counts the calls."""
    state = {"answers": [], "calls": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            answers = state["answers"]
            status, body = answers[min(state["calls"], len(answers) - 1)]
            state["calls"] += 1
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if status == 503:
                self.send_header("Retry-After", "0.1")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def test_a_worker_still_starting_is_asked_again_until_it_swaps(worker):
    worker["answers"] = [BUSY, BUSY, SWAPPED]
    body = admin_reload(worker["url"], "token", timeout_s=10, version="2")
    assert body["status"] == "swapped" and worker["calls"] == 3


def test_a_refused_version_is_final_at_once_and_says_to_roll_back(worker):
    worker["answers"] = [FAILED, SWAPPED]
    with pytest.raises(ReloadError, match="refused 2: weights do not fit.*keeps serving 1.*aieng model rollback"):
        admin_reload(worker["url"], "token", timeout_s=10, version="2")
    assert worker["calls"] == 1


def test_a_worker_busy_past_the_timeout_is_an_error_that_does_not_say_roll_back(worker):
    worker["answers"] = [BUSY]
    with pytest.raises(ReloadError, match="stayed busy for 1 s \\(the worker is still starting\\)") as caught:
        admin_reload(worker["url"], "token", timeout_s=1, version="2")
    assert "rollback" not in str(caught.value) and worker["calls"] >= 2


def test_the_reload_route_of_a_worker_still_starting_answers_503_with_retry_after():
    """The route's side of the contract above: a worker that has not loaded its model yet."""
    from starlette.testclient import TestClient

    from aieng.server.http.app import create_app
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.settings import Settings

    runtime = Runtime(RuntimeConfig(settings=Settings(admin_token="t0ken")))
    client = TestClient(create_app(runtime, start_runtime=False))
    answer = client.post("/admin/reload", headers={"Authorization": "Bearer t0ken"})
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert answer.json()["status"] == "busy" and "still starting" in answer.json()["error"]
