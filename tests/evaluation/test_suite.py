"""Held-out evaluation suite: well-formed reports, and the shipped demo model meets its bar."""

import json
import math

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from aieng.demo.corpus import FAMILIES
from aieng.evaluation import SUITE_NAME, EvalReport, evaluate, evaluate_dir


def _check_well_formed(report: EvalReport, n_per_family: int):
    assert report.suite == SUITE_NAME
    assert list(report.accuracy) == list(FAMILIES)
    assert all(0.0 <= v <= 1.0 for v in report.accuracy.values())
    assert math.isfinite(report.perplexity) and report.perplexity >= 1.0
    assert report.n_per_family == n_per_family
    assert report.seconds > 0
    data = report.to_dict()
    assert set(data) == {"suite", "accuracy", "perplexity", "n_per_family", "seconds"}
    json.dumps(data)


def test_tiny_model_gives_a_well_formed_report(tiny_demo_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_demo_dir, local_files_only=True)
    tokenizer.padding_side = "right"
    model = AutoModelForCausalLM.from_pretrained(tiny_demo_dir, local_files_only=True)
    model.train()
    report = evaluate(model, tokenizer, n_per_family=3, batch_size=5, max_new_tokens=6)
    _check_well_formed(report, 3)
    # evaluate restores what it changed on the caller's objects
    assert tokenizer.padding_side == "right" and model.training
    for _family, wrong in report.mistakes.items():
        assert len(wrong) <= 3 and all(set(w) == {"prompt", "expected", "got"} for w in wrong)


def test_evaluate_dir_loads_offline(tiny_demo_dir):
    _check_well_formed(evaluate_dir(tiny_demo_dir, n_per_family=2, max_new_tokens=4), 2)


@pytest.fixture(scope="module")
def demo_report(demo_model_dir) -> EvalReport:
    """The full suite on the shipped demo model, run once for the quality bar and its time bound."""
    return evaluate_dir(demo_model_dir)


def test_demo_model_meets_the_quality_bar(demo_report):
    report = demo_report
    _check_well_formed(report, 50)
    strong = [f for f, acc in report.accuracy.items() if acc >= 0.9]
    assert len(strong) >= 2, report.accuracy
    # Chance is ~1 % for a two-digit sum and far lower for a word sequence: 0.3 is "clearly above".
    assert all(acc >= 0.3 for acc in report.accuracy.values()), (report.accuracy, report.mistakes)
    assert report.perplexity < 1.5


@pytest.mark.perf
def test_the_demo_evaluation_takes_under_a_minute(demo_report):
    assert demo_report.seconds < 60
