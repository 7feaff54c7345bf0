"""The release gate: floors on the gate families, regression against the current version's eval."""

import pytest

from aieng.evaluation.gate import GateDecision, GateThresholds, release_gate


def _eval(suite="demo-heldout-v1", **accuracy):
    return {"suite": suite, "metrics": {"accuracy": accuracy, "perplexity": 2.0}, "n_per_family": 50}


GOOD = dict(reverse=0.98, json=0.96, add=0.98, sort=0.9)


def test_a_candidate_above_the_floors_and_without_regression_passes():
    decision = release_gate(_eval(**GOOD), _eval(**GOOD), GateThresholds(), current_version="1")
    assert decision.passed and decision.failures == [] and decision.regression_checked
    assert decision.to_dict() == {"passed": True, "failures": [], "regression_checked": True}


def test_the_defaults_are_the_deploy_runbooks():
    assert GateThresholds() == GateThresholds(("reverse", "json"), 0.9, 0.05)
    assert GateThresholds.with_overrides(gate_families=["add"], min_accuracy=None) == GateThresholds(("add",), 0.9, 0.05)


def test_a_gate_family_below_the_floor_fails_with_its_rate():
    decision = release_gate(_eval(**{**GOOD, "json": 0.84}), None, GateThresholds())
    assert not decision.passed
    assert decision.failures == ["json: 84.0% < 90%"]
    assert not decision.regression_checked


def test_exactly_the_floor_passes():
    assert release_gate(_eval(**{**GOOD, "json": 27 / 30}), None, GateThresholds()).passed


def test_a_regression_beyond_the_limit_fails_naming_the_current_version():
    decision = release_gate(_eval(**{**GOOD, "add": 0.80}), _eval(**GOOD), GateThresholds(), current_version="1")
    assert decision.failures == ["add: 80.0% regresses from 98.0% (current 1)"]


def test_a_drop_of_exactly_max_regression_passes():
    decision = release_gate(_eval(**{**GOOD, "reverse": 0.95}), _eval(**{**GOOD, "reverse": 1.0}), GateThresholds())
    assert decision.passed, decision.failures


def test_a_current_eval_of_another_suite_is_not_compared():
    decision = release_gate(_eval(**{**GOOD, "add": 0.10}), _eval(suite="old-suite", **GOOD), GateThresholds(),
                            current_version="1")
    assert decision.passed and not decision.regression_checked


def test_a_missing_family_counts_as_zero():
    candidate = _eval(reverse=0.98, add=0.98, sort=0.9)  # no "json"
    decision = release_gate(candidate, _eval(**GOOD), GateThresholds(), current_version="1")
    assert decision.failures == ["json: not measured (counts as 0%) < 90%", "json: 0.0% regresses from 96.0% (current 1)"]


def test_every_rule_that_fires_is_reported():
    candidate = _eval(reverse=0.5, json=0.84, add=0.80, sort=0.9)
    decision = release_gate(candidate, _eval(**GOOD), GateThresholds(), current_version="3")
    assert not decision.passed
    assert decision.failures == [
        "reverse: 50.0% < 90%",
        "json: 84.0% < 90%",
        "reverse: 50.0% regresses from 98.0% (current 3)",
        "json: 84.0% regresses from 96.0% (current 3)",
        "add: 80.0% regresses from 98.0% (current 3)",
    ]


def test_thresholds_are_honoured():
    strict = GateThresholds(gate_families=("sort",), min_accuracy=0.95, max_regression=0.0)
    decision = release_gate(_eval(**{**GOOD, "add": 0.97}), _eval(**GOOD), strict)
    assert decision.failures == ["sort: 90.0% < 95%", "add: 97.0% regresses from 98.0% (current version)"]


def test_a_candidate_without_an_evaluation_is_refused():
    with pytest.raises(ValueError, match="evaluate it first"):
        release_gate({}, None, GateThresholds())
    assert isinstance(release_gate(_eval(**GOOD)), GateDecision)
