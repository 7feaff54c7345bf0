"""The canary check: each rule fires on its own, against the stable version's window."""

import pytest

from aieng.errors import ConfigError
from aieng.release.canary_rollout import CanaryThresholds, StepEvidence, compare, step_verdict
from aieng.release.decision import Window

STABLE = Window(seconds=60, requests=500, errors=0, early_eos=10, latency_p99_s=0.40, ttft_p99_s=0.10)


def canary(**changes) -> Window:
    base = dict(seconds=60, requests=100, errors=0, early_eos=2, latency_p99_s=0.42, ttft_p99_s=0.11)
    return Window(**{**base, **changes})


@pytest.mark.parametrize(
    "window, rules",
    [
        (canary(), []),
        (canary(errors=2), ["success_rate"]),  # 98% < 99%
        (canary(errors=1), []),
        (canary(latency_p99_s=1.2), ["latency"]),  # 3x stable
        (canary(ttft_p99_s=0.5), ["ttft"]),
        (canary(ttft_p99_s=0.14), []),  # 1.4x: within the ratio
        (canary(early_eos=20), ["early_eos"]),  # 20% vs stable's 2%
        (canary(requests=10, latency_p99_s=5.0, early_eos=5), []),  # too few requests to judge latency or EOS
        (canary(requests=10, errors=1, latency_p99_s=5.0), ["success_rate"]),  # errors are judged at any count
    ],
)
def test_each_rule_fires_alone(window, rules):
    assert [f["rule"] for f in compare(window, STABLE)] == rules


def test_a_ratio_below_the_slack_is_noise_not_a_regression():
    fast = Window(seconds=60, requests=500, errors=0, early_eos=0, latency_p99_s=0.020, ttft_p99_s=0.010)
    assert compare(canary(latency_p99_s=0.045, ttft_p99_s=0.030), fast) == []  # 2-3x, but by under 50 ms
    assert [
        f["rule"]
        for f in compare(canary(latency_p99_s=0.045, ttft_p99_s=0.012), fast, CanaryThresholds(latency_slack_s=0))
    ] == ["latency"]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--steps", "10,5,100"], "rising"),
        (["--steps", "10,50"], "ending at 100"),
        (["--steps", "ten"], "percentages"),
        (["--interval", "soon"], "--interval"),
        (["--min-step-time", "soon"], "--min-step-time"),
        (["--max-step-wait", "later"], "--max-step-wait"),
    ],
)
def test_bad_canary_flags_are_refused_before_anything_changes(tmp_path, flags, says):
    from aieng.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["release", "canary", "demo", "2", "--store", str(tmp_path), "--url", "http://127.0.0.1:9", *flags])
    assert says in str(exit_info.value)
    assert not any(tmp_path.iterdir())  # nothing written to the store


def test_the_promql_of_a_check_names_the_version_the_selector_and_the_whole_interval():
    from aieng.release.sources import promql

    queries = promql("3", 59.2, 'job="aieng"')
    assert queries["requests"] == (
        'sum(increase(aieng_requests_total{route=~"/v1/completions|/v1/chat/completions",'
        'version="3",job="aieng"}[60s]))'
    )
    assert 'code=~"5.."' in queries["errors"]
    assert queries["ttft_p99_s"] == (
        "histogram_quantile(0.99, sum by (le) (increase("
        'aieng_time_to_first_token_seconds_bucket{version="3",job="aieng"}[60s])))'
    )
    assert all('version="3"' in q for q in queries.values())


def test_a_prometheus_that_does_not_answer_is_a_clear_error():
    from aieng.bench.server_process import free_port
    from aieng.release.sources import PrometheusMetrics

    with pytest.raises(RuntimeError, match="did not answer"):
        PrometheusMetrics(f"http://127.0.0.1:{free_port()}", timeout_s=2).query("up")


@pytest.mark.parametrize(
    "requests, seconds, failures, verdict",
    [
        (0, 60.0, [], "wait"),  # a clean check with no canary request is no evidence
        (99, 60.0, [], "wait"),
        (100, 60.0, [], "pass"),
        (100, 5.0, [], "wait"),  # enough requests, not yet long enough at the step
        (40, 300.0, [], "timeout"),  # clean but thin past the deadline: the policy decides
        (500, 300.0, [{"rule": "latency"}], "fail"),  # a rule that fired is never outweighed
        (0, 0.0, [{"rule": "success_rate"}], "fail"),
    ],
)
def test_a_step_passes_on_evidence_and_never_silently(requests, seconds, failures, verdict):
    evidence = StepEvidence(min_requests=100, min_seconds=30, max_wait_s=300)
    assert step_verdict(evidence, requests, seconds, failures, max_wait_s=300) == verdict


def test_a_step_whose_latency_was_never_judged_waits_however_many_requests_it_saw():
    """Enough requests over the step, but never enough in one check for the latency rules: a slow
    canary would pass unseen. It waits for a check that can judge it (or the policy decides)."""
    evidence = StepEvidence(min_requests=5, max_wait_s=30)
    assert step_verdict(evidence, 40, 10.0, [], max_wait_s=30, judged=False) == "wait"
    assert step_verdict(evidence, 40, 30.0, [], max_wait_s=30, judged=False) == "timeout"
    assert step_verdict(evidence, 40, 10.0, [], max_wait_s=30, judged=True) == "pass"


def test_step_evidence_refuses_an_unknown_policy_or_negative_minimums():
    with pytest.raises(ConfigError, match="hold, rollback, promote"):
        StepEvidence(on_timeout="pass")
    with pytest.raises(ConfigError, match=">= 0"):
        StepEvidence(min_requests=-1)
