"""warmup_verify and incident_triage executed with papermill against a real server (the session's,
which they only read)."""

import pytest
from papermill.exceptions import PapermillExecutionError

from aieng.workbook.runbooks import execute


@pytest.fixture(scope="module")
def live_server(shared_server):
    return shared_server


def test_warmup_verify_passes_on_a_healthy_server_and_keeps_a_record(live_server, tmp_path):
    executed = execute(
        "warmup_verify",
        {"base_url": live_server.base_url, "expected_model": "demo@1", "dry_run": False},
        runs_dir=tmp_path,
    )
    text = executed.read_text()
    assert "same text" in text and "answers correctly" in text


def test_warmup_verify_dry_run_only_checks_health(live_server, tmp_path):
    executed = execute("warmup_verify", {"base_url": live_server.base_url}, runs_dir=tmp_path)
    assert "[dry run] skipping the generation checks" in executed.read_text()


def test_warmup_verify_fails_loudly_on_the_wrong_model(live_server, tmp_path):
    with pytest.raises(PapermillExecutionError, match="expected demo@7"):
        execute("warmup_verify", {"base_url": live_server.base_url, "expected_model": "demo@7"}, runs_dir=tmp_path)


def test_incident_triage_produces_a_diagnosis(live_server, session_store, tmp_path):
    import httpx

    httpx.post(f"{live_server.base_url}/v1/completions", json={"model": "demo", "prompt": "x", "temperature": -1})
    params = {"base_url": live_server.base_url, "window_s": 1, "store": str(session_store.root)}
    text = execute("incident_triage", params, runs_dir=tmp_path).read_text()
    assert "verdict:" in text and "server answering" in text and "TTFT p99 <= 1.5s" in text
    assert "demo: current 1, canary none" in text and "recent history:" in text  # what should be serving
    assert "OK       store agrees with server" in text and "every worker serves 1" in text


def test_incident_triage_on_a_dead_server_says_so_and_what_to_run_next(tmp_path):
    from aieng.bench.server_process import free_port

    closed = f"http://127.0.0.1:{free_port()}"
    params = {"base_url": closed, "window_s": 1, "name": "demo", "store": str(tmp_path / "store")}
    text = execute("incident_triage", params, runs_dir=tmp_path).read_text()  # no PapermillExecutionError
    assert "NOT ANSWERING" in text and "FAIL     server answering" in text
    assert "systemctl status aieng" in text and "run next: runbooks/rollback.ipynb" in text
    assert "no metrics: server not answering" in text and "'demo' is not in the store" in text


def test_incident_triage_takes_its_thresholds_from_the_alert_rules(live_server, tmp_path):
    from aieng.observability.alerts import DEFAULT_RULES

    rules = tmp_path / "alerts.yml"
    rules.write_text(DEFAULT_RULES.read_text().replace("[5m]))) > 1.5", "[5m]))) > 2.25"))
    executed = execute(
        "incident_triage",
        {"base_url": live_server.base_url, "window_s": 1, "alert_rules": str(rules)},
        runs_dir=tmp_path,
    )
    assert "TTFT p99 <= 2.25s" in executed.read_text()


def test_load_test_dry_run_sends_nothing_then_a_run_passes_its_checks_and_keeps_the_report(live_server, tmp_path):
    import json

    from aieng.observability.scrape import scrape

    before = scrape(live_server.base_url).value("aieng_requests_total", route="/v1/chat/completions")
    params = {"server_url": live_server.base_url, "duration_s": 6.0, "rate": 8.0, "out_dir": str(tmp_path / "out")}
    record = execute("load_test", params, runs_dir=tmp_path).read_text()
    assert "[dry run] nothing sent" in record and "poisson arrivals at 8 req/s for 6 s" in record
    assert scrape(live_server.base_url).value("aieng_requests_total", route="/v1/chat/completions") == before
    record = execute("load_test", {**params, "dry_run": False}, runs_dir=tmp_path).read_text()
    assert "passed: rss_growth, metrics_agree, idle_after, error_rate" in record
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["passed"] and results["levels"][0]["summary"]["all"]["ok"] >= 20
    assert set(results["levels"][0]["summary"]["classes"]) == {"short", "medium", "long"}
    assert (tmp_path / "out" / "report.html").stat().st_size > 10_000  # the plots are in it
    assert "image/png" in record  # and in the audit copy


def test_load_test_refuses_an_unknown_workload_by_name(live_server, tmp_path):
    with pytest.raises(PapermillExecutionError, match="no built-in workload 'nosuch'"):
        execute("load_test", {"server_url": live_server.base_url, "workload": "nosuch"}, runs_dir=tmp_path)
