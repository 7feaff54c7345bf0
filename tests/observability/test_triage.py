"""Triage on recorded /metrics snapshots and on a server that does not answer.

``recorded/overload_*.prom`` were scraped from a real 2-worker demo server (``aieng serve
--workers 2 --max-queue 8 --max-batch-size 8``) before and after 60 concurrent completions, then
6 streams whose client left after the first token, one invalid request and five chat requests:
37 generations finished in the window, 28 requests refused with 429, one 400, 6 aborts in decode.
"""

from pathlib import Path

import pytest

from aieng.bench.server_process import free_port
from aieng.observability.alerts import triage_thresholds
from aieng.observability.evidence import Health, ReleaseState, measure, observe, probe_health, release_state
from aieng.observability.scrape import Snapshot, parse
from aieng.observability.triage import FAIL, NOTE, OK, UNKNOWN, diagnose, table, triage, verdict

from ..command import aieng

RECORDED = Path(__file__).parent / "recorded"
LIMITS = triage_thresholds()


@pytest.fixture(scope="module")
def window():
    before = parse((RECORDED / "overload_before.prom").read_text())
    after = parse((RECORDED / "overload_after.prom").read_text())
    return before, after


def ready_health(**body) -> Health:
    ready = {"status": "ready", "model": "demo", "version": "1", **body}
    return Health("http://h", 200, 200, ready, [{"id": "demo", "version": "1"}])


def test_a_recorded_window_reads_as_the_load_that_made_it(window):
    o = observe(*window, seconds=12)
    assert o.http_codes["429"] == 28 and o.http_codes["400"] == 1 and o.refused == 28
    assert o.error_codes == {"invalid_parameter": 1.0, "overloaded": 28.0}
    assert o.finished == 37 and o.early_eos == pytest.approx(5 / 37)  # the chat answers are short
    assert o.aborts == {"decode": 6.0} and o.abort_rate == pytest.approx(6 / 43)
    assert o.kv_rows == (0.0, 16.0) and 0.3 < o.kv_full_share < 0.5  # 8 rows per worker, often all taken
    assert o.e2e_objective_s == 30.0 and 0 < o.e2e_p99_s < 30 and o.output_tokens_p50 > 16
    assert o.server_errors == 0 and o.error_rate == 0
    assert sorted(o.served.values()) == ["1", "1"]  # two workers, both on version 1
    assert 0 < o.p99_s["queue wait"] and 0 < o.p99_s["TTFT"] and 0 < o.memory_used < 1


def test_turned_away_clients_fail_the_queue_check_and_point_at_the_load_runbook(window):
    findings = diagnose(ready_health(), observe(*window, seconds=12), LIMITS)
    queue = next(f for f in findings if f.check.startswith("queue"))
    assert queue.status == FAIL and "28 refused with 429 in 12 s" in queue.detail
    assert queue.runbook == "runbooks/load_test.ipynb" and "add instances" in queue.action
    five_xx = next(f for f in findings if f.check.startswith("5xx"))
    assert five_xx.status == OK and "invalid_parameter x1" in five_xx.detail  # a 400 is not a server error
    assert verdict(findings).startswith("investigate: queue")


def test_server_errors_over_the_alert_threshold_fail_and_name_rollback(window):
    before, after = window
    broken = dict(after.samples)
    broken[("aieng_requests_total", (("code", "500"), ("route", "/v1/completions"), ("version", "1")))] = 30.0
    findings = diagnose(ready_health(), observe(before, Snapshot(broken), seconds=12), LIMITS)
    five_xx = next(f for f in findings if f.check.startswith("5xx"))
    assert five_xx.status == FAIL and five_xx.detail.startswith("30 of 103 requests")
    assert five_xx.runbook == "runbooks/rollback.ipynb"


@pytest.mark.parametrize(
    ("sample", "value", "check", "detail"),
    [
        (("aieng_client_aborts_total", (("phase", "queued"), ("version", "1"))), 30.0, "client aborts", "queued 30"),
        (("aieng_kv_cache_full_steps_total", ()), 1e6, "KV cache full", "rows in use; full with requests"),
        (("aieng_slo_e2e_p99_seconds", ()), 0.1, "e2e p99 <= objective 0.1s", "start to last token"),
    ],
)
def test_the_operations_signals_fail_past_their_alert_thresholds(window, sample, value, check, detail):
    before, after = window
    moved = dict(after.samples)
    moved[sample] = value if sample[0] == "aieng_slo_e2e_p99_seconds" else moved.get(sample, 0.0) + value
    findings = diagnose(ready_health(), observe(before, Snapshot(moved), seconds=12), LIMITS)
    row = next(f for f in findings if f.check.startswith(check))
    assert row.status == FAIL and detail in row.detail and row.runbook == "runbooks/load_test.ipynb", table(findings)


def test_a_quiet_window_is_healthy(window):
    before, _ = window
    findings = diagnose(ready_health(), observe(before, before, seconds=5), LIMITS)
    assert {f.status for f in findings} == {OK}, table(findings)
    assert verdict(findings) == "healthy"


def test_a_server_that_does_not_answer_is_a_finding_not_a_traceback():
    closed = f"http://127.0.0.1:{free_port()}"
    health = probe_health(closed, timeout=2)
    assert not health.answering and "ConnectError" in health.error
    observed = measure(closed, 0)
    assert isinstance(observed, str) and "did not answer" in observed
    findings = diagnose(health, observed, LIMITS)
    assert findings[0].status == FAIL and findings[0].check == "server answering"
    assert "systemctl status aieng" in findings[0].action and findings[0].runbook == "runbooks/rollback.ipynb"
    assert {f.status for f in findings[1:]} == {UNKNOWN}
    assert verdict(findings) == "investigate: server answering"
    assert "NOT ANSWERING" in health.summary()


def test_a_failed_hot_swap_in_readiness_says_what_still_serves():
    swap = {"status": "failed", "previous": "1", "version": "2", "error": "verification failed", "seconds": 0.4}
    findings = diagnose(ready_health(swap=swap), "not measured", LIMITS)
    row = next(f for f in findings if f.check == "last hot swap")
    assert row.status == FAIL and "swap to 2 failed (verification failed); still serving 1" in row.detail
    assert "roll the store back to 1" in row.action


@pytest.mark.parametrize(
    ("status", "runbook"), [("starting", "runbooks/warmup_verify.ipynb"), ("failed", "runbooks/rollback.ipynb")]
)
def test_not_ready_names_the_phase_and_what_to_do(status, runbook):
    health = Health("http://h", 200, 503, {"status": status, "phase": "warmup", "seconds": 12.0}, [])
    row = diagnose(health, "not measured", LIMITS)[1]
    assert row.status == FAIL and row.detail == f"/health/ready 503: {status}, phase warmup for 12 s"
    assert row.runbook == runbook


def test_a_store_the_server_has_not_followed_fails_and_a_canary_is_the_first_suspect(window):
    release = ReleaseState("demo", "2", {"version": "3", "weight": 0.1}, [])
    findings = diagnose(ready_health(), observe(*window, seconds=12), LIMITS, release)
    agree = next(f for f in findings if f.check == "store agrees with server")
    assert agree.status == FAIL and agree.detail == "store current is 2, workers serve ['1']"
    canary = next(f for f in findings if f.check == "canary")
    assert canary.status == NOTE and "demo@3 takes 10% of unpinned traffic" in canary.detail
    assert "aieng release canary demo --abort --reason" in canary.action
    assert "canary" not in verdict(findings)  # a note, not a failure


def test_the_release_state_reads_the_store_and_survives_a_missing_one(tmp_path, demo_model_dir):
    from aieng.store import ModelStore

    missing = release_state(tmp_path / "nowhere", "demo")
    assert missing.problem and missing.lines() == [f"store: {missing.problem}"]
    row = diagnose(ready_health(), "not measured", LIMITS, missing)[2]
    assert row.status == UNKNOWN and "not in the store" in row.detail

    store = ModelStore(tmp_path / "store")
    store.register(demo_model_dir, "demo", "1")
    store.promote("demo", "1", reason="test: first")
    state = release_state(store.root, "demo")
    assert state.current == "1" and state.canary is None and state.history[-1]["reason"] == "test: first"
    assert "demo: current 1, canary none" in state.lines()


def test_aieng_triage_at_a_shell_exits_3_on_a_dead_server(tmp_path):
    result = aieng("triage", "--url", f"http://127.0.0.1:{free_port()}", "--window", "0", store=tmp_path / "s")
    assert result.returncode == 3, result.stderr
    assert "NOT ANSWERING" in result.stdout and "verdict: investigate: server answering" in result.stdout


def test_triage_runs_every_step_against_a_live_server(shared_server, tmp_path):
    report = triage(shared_server.base_url, LIMITS, window_s=0.2, store_root=tmp_path / "empty")
    assert report.health.answering and report.release.problem  # the server's model, not in this empty store
    assert report.findings[0].status == OK and not isinstance(report.observed, str)
    assert len(report.observed.served) == 2
