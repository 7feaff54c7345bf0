"""The release gate: evidence, suite, comparison, floors, regression, perplexity, template and
performance rules, every rule that fires. Thresholds are the demo suite's unless a test says."""

import pytest

from aieng.demo.heldout_suite import THRESHOLDS
from aieng.evaluation.gate import Evidence, GateDecision, GateThresholds
from aieng.evaluation.gate import release_gate as gate_of

DEMO = GateThresholds.from_suite(THRESHOLDS)


def release_gate(candidate, current=None, thresholds=DEMO) -> GateDecision:
    return gate_of(candidate, current, thresholds)


SHA = "a" * 64


def _eval(suite="demo-heldout-v1", perplexity=1.01, template=SHA, **accuracy):
    return {
        "suite": suite,
        "metrics": {"accuracy": accuracy, "perplexity": perplexity},
        "n_per_family": 50,
        "template_sha256": template,
    }


def _version(version="2", baseline=None, template=SHA, **eval_kwargs):
    return Evidence(version, _eval(**eval_kwargs), baseline, template)


GOOD = dict(reverse=0.98, json=0.96, add=0.98, sort=0.9)
BASELINE = {"concurrency": 32, "max_tokens": 64, "tokens_per_s": 1000.0, "latency_p99_s": 0.5}


def _messages(decision: GateDecision) -> list[str]:
    return decision.messages


def test_a_candidate_above_the_floors_and_without_regression_passes():
    decision = release_gate(_version(**GOOD), _version("1", **GOOD))
    compared = {"eval": True, "answers": False, "performance": False}
    assert decision.passed and decision.failures == [] and decision.compared == compared
    assert decision.to_dict() == {"passed": True, "failures": [], "compared": compared}


def test_the_defaults_pass_the_demo_on_any_cpu_and_refuse_a_broken_build():
    assert DEMO == GateThresholds(floors={"reverse": 0.8, "json": 0.8}, max_perplexity=2.0)
    assert GateThresholds().floors == {} and GateThresholds().max_perplexity is None  # a suite's to set
    epyc = dict(reverse=0.96, json=0.94, add=0.86, sort=0.92)  # the weakest demo build measured so far
    assert release_gate(_version(**epyc)).passed
    assert not release_gate(_version(reverse=0.1, json=0.0, add=0.0, sort=0.0, perplexity=9.0)).passed
    assert DEMO.replaced(gate_families=["add"], min_accuracy=None).floors == {"add": 0.8}
    assert DEMO.replaced(gate_families=["json", "add"], min_accuracy=0.9).floors == {"json": 0.9, "add": 0.9}
    assert DEMO.replaced(min_accuracy=0.5).floors == {"reverse": 0.5, "json": 0.5}
    assert DEMO.replaced(max_perplexity=None) == DEMO  # None: not given
    with pytest.raises(ValueError, match="unknown gate thresholds"):
        GateThresholds().replaced(min_acuracy=0.5)


def test_a_gate_family_below_the_floor_fails_with_its_rate_and_rule():
    decision = release_gate(_version(**{**GOOD, "json": 0.74}))
    assert not decision.passed
    assert decision.failures == [{"rule": "floor", "message": "json: 74.0% < 80%"}]
    assert decision.rules_fired == ["floor"] and decision.compared["eval"] is False


def test_exactly_the_floor_passes():
    assert release_gate(_version(**{**GOOD, "json": 24 / 30})).passed


def test_a_regression_beyond_the_limit_fails_naming_the_current_version():
    decision = release_gate(_version(**{**GOOD, "add": 0.80}), _version("1", **GOOD))
    assert _messages(decision) == ["regression: add: 80.0% regresses from 98.0% (current 1)"]


def test_a_drop_of_exactly_max_regression_passes():
    decision = release_gate(_version(**{**GOOD, "reverse": 0.95}), _version("1", **{**GOOD, "reverse": 1.0}))
    assert decision.passed, decision.failures


def test_a_current_eval_of_another_suite_is_not_compared():
    decision = release_gate(_version(**{**GOOD, "add": 0.10}), _version("1", suite="old-suite", **GOOD))
    assert decision.passed and not decision.compared["eval"]


def test_a_missing_family_counts_as_zero():
    candidate = _version(reverse=0.98, add=0.98, sort=0.9)  # no "json"
    decision = release_gate(candidate, _version("1", **GOOD))
    assert _messages(decision) == [
        "floor: json: not measured (counts as 0%) < 80%",
        "regression: json: 0.0% regresses from 96.0% (current 1)",
    ]


def test_perplexity_has_a_ceiling_and_a_limit_on_its_rise():
    assert _messages(release_gate(_version(perplexity=2.5, **GOOD))) == ["perplexity: 2.500 > ceiling 2"]
    decision = release_gate(_version(perplexity=1.5, **GOOD), _version("1", perplexity=1.1, **GOOD))
    assert _messages(decision) == ["perplexity: 1.500 rises more than 25% over 1.100 (current 1)"]
    assert release_gate(_version(perplexity=1.375, **GOOD), _version("1", perplexity=1.1, **GOOD)).passed
    assert release_gate(_version(perplexity=50.0, **GOOD), None, GateThresholds(max_perplexity=None)).passed


def test_a_template_changed_since_the_evaluation_is_refused():
    changed = Evidence("2", _eval(template="b" * 64, **GOOD), None, SHA)
    assert _messages(release_gate(changed)) == [
        "template: the chat template changed since the evaluation (evaluated with bbbbbbbbbbbb, ships aaaaaaaaaaaa): "
        "re-run `aieng eval`"
    ]
    unrecorded = Evidence("2", _eval(template=None, **GOOD), None, SHA)
    assert release_gate(unrecorded).rules_fired == ["template"]
    assert release_gate(Evidence("2", _eval(template=None, **GOOD), None, None)).passed  # no template at all


def test_performance_is_compared_only_under_the_same_load():
    slow = {**BASELINE, "tokens_per_s": 700.0, "latency_p99_s": 0.9}
    decision = release_gate(_version(baseline=slow, **GOOD), _version("1", baseline=BASELINE, **GOOD))
    assert decision.compared == {"eval": True, "answers": False, "performance": True}
    assert _messages(decision) == [
        "performance: 700.0 tokens/s drops more than 20% below 1000.0 (current 1)",
        "performance: p99 latency 0.900 s > 1.5 x 0.500 s (current 1)",
    ]
    other_load = {**slow, "concurrency": 8}
    decision = release_gate(_version(baseline=other_load, **GOOD), _version("1", baseline=BASELINE, **GOOD))
    assert decision.passed and not decision.compared["performance"]
    at_the_limit = {**BASELINE, "tokens_per_s": 800.0, "latency_p99_s": 0.75}
    assert release_gate(_version(baseline=at_the_limit, **GOOD), _version("1", baseline=BASELINE, **GOOD)).passed


def test_every_rule_that_fires_is_reported():
    candidate = Evidence(
        "3",
        _eval(reverse=0.5, json=0.74, add=0.80, sort=0.9, perplexity=3.0, template="c" * 64),
        {**BASELINE, "tokens_per_s": 10.0},
        SHA,
    )
    decision = release_gate(candidate, _version("2", baseline=BASELINE, **GOOD))
    assert not decision.passed
    assert decision.rules_fired == ["floor", "regression", "perplexity", "template", "performance"]
    assert _messages(decision)[:5] == [
        "floor: reverse: 50.0% < 80%",
        "floor: json: 74.0% < 80%",
        "regression: reverse: 50.0% regresses from 98.0% (current 2)",
        "regression: json: 74.0% regresses from 96.0% (current 2)",
        "regression: add: 80.0% regresses from 98.0% (current 2)",
    ]


def test_thresholds_are_honoured():
    strict = GateThresholds(floors={"sort": 0.95}, max_regression=0.0)
    current = Evidence(None, _eval(**GOOD), None, SHA)
    decision = release_gate(_version(**{**GOOD, "add": 0.97}), current, strict)
    assert _messages(decision) == [
        "floor: sort: 90.0% < 95%",
        "regression: add: 97.0% regresses from 98.0% (current version)",
    ]


def test_a_candidate_without_an_evaluation_is_refused():
    assert release_gate(Evidence("2", None), None).messages == [
        "evidence: 2 has no graded evaluation (a suite with assertions, `aieng eval`) and there is no current "
        "version to compare with: evaluate it with a labelled suite, or promote with --force --reason"
    ]
    decision = release_gate(Evidence("2", None), _version("1", **GOOD))
    assert decision.rules_fired == ["evidence"] and "aieng eval N@2 --compare" in decision.messages[0]


def _compared(against="1", **metrics):
    base = dict(cases=40, changed=0, agreement=1.0, length_ratio=1.0, empty_rate=0.0, stable_empty_rate=0.0)
    base.update(refusal_rate=0.0, stable_refusal_rate=0.0, perplexity_ratio=1.0)
    base.update(metrics)
    changed = [{"id": f"c{i}"} for i in range(base["changed"])]
    return Evidence("2", None, comparison={"against": against, "metrics": base, "changed": changed})


def test_a_comparison_with_the_current_version_is_evidence_and_an_exact_copy_passes():
    current = _version("1", **GOOD)
    decision = release_gate(_compared(), current)
    assert decision.passed and decision.compared["answers"], decision.messages
    stale = release_gate(_compared(against="0"), current)
    assert stale.rules_fired == ["evidence"] and "its comparison is with version 0" in stale.messages[0]


def test_a_changed_candidate_is_refused_by_the_comparison_naming_the_cases():
    changed = _compared(changed=12, agreement=0.7, length_ratio=1.6, empty_rate=0.2, perplexity_ratio=3.0)
    decision = release_gate(changed, _version("1", **GOOD))
    assert decision.rules_fired == ["comparison"]
    assert decision.messages == [
        "comparison: agreement 70.0% < 90% with current 1 (12 of 40 answers changed, e.g. c0, c1, c2, c3, c4)",
        "comparison: answers 1.60x as long as current 1's, outside [0.8, 1.25]",
        "comparison: empty answers 20.0% vs 0.0% (current 1), more than 5% up",
        "comparison: current 1's answers are 3.00x as perplexing under the candidate (> 1.25)",
    ]
    assert release_gate(changed, _version("1", **GOOD), DEMO.replaced(min_agreement=0.7)).rules_fired == ["comparison"]


def test_grades_from_another_suite_than_the_registered_one_are_refused():
    evaluated = _eval(**GOOD) | {"suite_sha256": "e" * 64}
    registered = {"label": "demo-heldout-v1", "sha256": "f" * 64}
    decision = release_gate(Evidence("2", evaluated, None, SHA, suite=registered))
    assert decision.rules_fired == ["suite"]
    assert release_gate(Evidence("2", evaluated, None, SHA, suite={**registered, "sha256": "e" * 64})).passed
