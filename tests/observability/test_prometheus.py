"""Alert rules are valid, and a real Prometheus server scrapes a real aieng server."""

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="the prometheus binary is absent (Debian package `prometheus`; .ci/run installs it)",
)


@needs_prometheus
def test_promtool_accepts_the_alert_rules_and_the_scrape_config():
    rules = subprocess.run(
        ["promtool", "check", "rules", str(ROOT / "deploy/prometheus/alerts.yml")], capture_output=True, text=True
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS" in rules.stdout


@needs_prometheus
def test_the_alert_rules_fire_on_the_series_they_are_written_for():
    """promtool's rule unit tests: the canary alert fires for a canary failing more than its stable
    version (and not for a healthy one), the error-rate alert for 20% failed generations."""
    result = subprocess.run(
        ["promtool", "test", "rules", "alerts_test.yml"], cwd=ROOT / "deploy/prometheus", capture_output=True, text=True
    )
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_a_real_prometheus_scrapes_time_to_first_token(two_workers, prometheus):
    url = prometheus(two_workers.base_url)
    body = {"model": "demo", "prompt": "<|bos|><|user|>add: 22+22<|end|><|assistant|>", "max_tokens": 4}
    for _ in range(5):
        assert httpx.post(f"{two_workers.base_url}/v1/completions", json=body, timeout=30).status_code == 200
    value = 0.0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = httpx.get(
            f"{url}/api/v1/query", timeout=5, params={"query": "sum(aieng_time_to_first_token_seconds_count)"}
        ).json()["data"]["result"]
        if result and float(result[0]["value"][1]) >= 5:
            value = float(result[0]["value"][1])
            break
        time.sleep(0.5)
    assert value >= 5
    rules = httpx.get(f"{url}/api/v1/rules", timeout=5).json()
    assert len([r for g in rules["data"]["groups"] for r in g["rules"]]) >= 6  # the alert rules loaded
