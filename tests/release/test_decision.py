"""The rollback decision tree, one table row per branch (and the edges of each threshold)."""

import pytest

from aieng.release.decision import HOLD, PROMOTE, ROLLBACK, RollbackThresholds, Window, decide

BASELINE = {"concurrency": 32, "latency_p99_s": 1.0, "ttft_p99_s": 0.2, "tokens_per_s": 1000.0}
HEALTHY = dict(
    seconds=60.0,
    requests=100,
    errors=0,
    early_eos=2,
    latency_p99_s=1.1,
    ttft_p99_s=0.25,
    tokens_per_s=950.0,
    mean_running=32.0,
)

CASES = [
    # (changes to the healthy window, baseline, expected action, expected rule)
    ({}, BASELINE, PROMOTE, "healthy"),
    ({"seconds": 30.0}, BASELINE, HOLD, "window_open"),
    ({"eval_regressed": True}, BASELINE, ROLLBACK, "eval_regression"),
    ({"eval_regressed": True, "requests": 0, "seconds": 1.0}, BASELINE, ROLLBACK, "eval_regression"),
    ({"errors": 6}, BASELINE, ROLLBACK, "error_rate"),
    ({"errors": 5}, BASELINE, PROMOTE, "healthy"),  # exactly 5%: within
    ({"requests": 4, "errors": 3, "seconds": 5.0}, BASELINE, ROLLBACK, "error_rate"),  # a burst needs no quorum
    ({"requests": 4, "errors": 2, "seconds": 5.0}, BASELINE, HOLD, "window_open"),  # 2 errors are not a trend
    ({"requests": 10, "seconds": 5.0}, BASELINE, HOLD, "window_open"),
    ({"requests": 10, "seconds": 90.0}, BASELINE, HOLD, "insufficient_traffic"),
    ({"early_eos": 16}, BASELINE, ROLLBACK, "early_eos"),
    ({"early_eos": 15}, BASELINE, PROMOTE, "healthy"),
    ({"early_eos": 90}, {**BASELINE, "early_eos_rate": 0.5}, PROMOTE, "healthy"),  # short replies are normal here
    ({"early_eos": 100}, {**BASELINE, "early_eos_rate": 0.4}, ROLLBACK, "early_eos"),
    ({"latency_p99_s": 2.01}, BASELINE, ROLLBACK, "latency"),
    ({"latency_p99_s": 2.0}, BASELINE, PROMOTE, "healthy"),
    ({"ttft_p99_s": 0.5}, BASELINE, ROLLBACK, "ttft"),
    ({"tokens_per_s": 700.0}, BASELINE, ROLLBACK, "throughput"),
    ({"tokens_per_s": 700.0, "mean_running": 8.0}, BASELINE, PROMOTE, "healthy"),  # light load: not comparable
    ({"tokens_per_s": 800.0}, BASELINE, PROMOTE, "healthy"),
    ({"latency_p99_s": 9.0, "tokens_per_s": 1.0}, None, PROMOTE, "healthy"),  # no baseline: quality and errors only
    ({"latency_p99_s": None, "ttft_p99_s": None, "tokens_per_s": None}, BASELINE, PROMOTE, "healthy"),
    ({"errors": 50, "latency_p99_s": 9.0}, BASELINE, ROLLBACK, "error_rate"),  # the tree's order: errors first
]


@pytest.mark.parametrize("changes, baseline, action, rule", CASES)
def test_the_decision_tree(changes, baseline, action, rule):
    decision = decide(Window(**{**HEALTHY, **changes}), baseline)
    assert (decision.action, decision.rule) == (action, rule), decision.reason
    assert decision.reason and decision.to_dict()["action"] == action


def test_reasons_carry_the_numbers_and_thresholds_are_honoured():
    decision = decide(Window(**{**HEALTHY, "latency_p99_s": 2.5}), BASELINE)
    assert decision.reason == "p99 latency 2.500 s > 2 x baseline 1.000 s"
    lenient = RollbackThresholds(max_latency_ratio=3.0, window_s=10.0)
    assert decide(Window(**{**HEALTHY, "latency_p99_s": 2.5, "seconds": 12.0}), BASELINE, lenient).action == PROMOTE
