"""Alert thresholds come from deploy/prometheus/alerts.yml, the file Prometheus loads."""

import re

import pytest
import yaml

from aieng.errors import ConfigError
from aieng.observability.alerts import DEFAULT_RULES, TRIAGE_ALERTS, alert_thresholds, triage_thresholds


def _rules(path=DEFAULT_RULES):
    return {rule["alert"]: rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]}


def test_the_default_is_the_projects_rule_file():
    assert DEFAULT_RULES.is_file() and DEFAULT_RULES.parts[-3:] == ("deploy", "prometheus", "alerts.yml")
    assert alert_thresholds() == alert_thresholds(DEFAULT_RULES)


def test_the_triage_thresholds_are_the_numbers_in_the_file():
    thresholds = triage_thresholds()
    assert (
        thresholds.ttft_p99_s,
        thresholds.server_error_rate,
        thresholds.early_eos_rate,
        thresholds.host_memory_used,
        thresholds.queue_saturation,
    ) == (1.5, 0.05, 0.15, 0.95, 0.8)
    rules = _rules()
    for field_name, alert in TRIAGE_ALERTS.items():
        # each number is literally the end of its alert's expression, not a copy kept elsewhere
        assert re.search(rf">\s*{getattr(thresholds, field_name)!r}\s*$", rules[alert]["expr"].strip()), alert


def test_every_single_threshold_rule_is_read_and_compound_ones_are_left_out():
    found = alert_thresholds()
    rules = _rules()
    compound = {name for name, rule in rules.items() if re.search(r"\band\b|\bor\b|\bunless\b", rule["expr"])}
    assert compound == {"AiengDecodeThroughputBelowBaseline", "AiengCanaryErrorRateAboveStable"}
    against_a_series = {
        name for name, rule in rules.items() if not re.search(r"[<>=]\s*[-+]?[\d.]+\s*$", rule["expr"].strip())
    }
    assert against_a_series - compound == {"AiengE2ELatencyP99High"}  # the objective is a server setting
    assert set(found) == set(rules) - compound - against_a_series


def test_editing_the_rule_file_changes_the_thresholds(tmp_path):
    text = DEFAULT_RULES.read_text()
    edited = tmp_path / "alerts.yml"
    ttft_expr = _rules()["AiengTTFTp99High"]["expr"]
    assert text.count(ttft_expr) == 1
    edited.write_text(text.replace(ttft_expr, ttft_expr.replace("> 1.5", "> 2.25")))
    assert triage_thresholds(edited).ttft_p99_s == 2.25
    assert triage_thresholds(edited).early_eos_rate == triage_thresholds().early_eos_rate


def test_a_missing_alert_is_an_error_naming_it(tmp_path):
    document = yaml.safe_load(DEFAULT_RULES.read_text())
    for group in document["groups"]:
        group["rules"] = [rule for rule in group["rules"] if rule["alert"] != "AiengAbnormalEarlyEOS"]
    edited = tmp_path / "alerts.yml"
    edited.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError, match="AiengAbnormalEarlyEOS"):
        triage_thresholds(edited)


def test_an_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read alert rules"):
        alert_thresholds(tmp_path / "nope.yml")
