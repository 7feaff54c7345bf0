"""Running a suite: well-formed reports on a tiny model, the demo suite's bar on the demo model,
sampled and raw-prompt cases, perplexity of a text."""

import json
import math

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from aieng.demo.corpus import FAMILIES
from aieng.demo.heldout_suite import demo_suite
from aieng.evaluation.suite import EvalReport, evaluate, evaluate_dir
from aieng.evaluation.suite_file import load_suite


def _check_well_formed(report: EvalReport, n_per_family: int):
    assert report.suite == "demo-heldout-v1" and report.suite_sha256 == demo_suite().sha256
    assert list(report.accuracy) == list(FAMILIES)
    assert all(0.0 <= v <= 1.0 for v in report.accuracy.values())
    assert math.isfinite(report.perplexity) and report.perplexity >= 1.0
    assert report.n_per_family == n_per_family
    assert len(report.cases) == n_per_family * len(FAMILIES)
    assert {c["id"].split("-")[0] for c in report.cases} == set(FAMILIES)
    assert report.seconds > 0
    json.dumps(report.metrics())  # raises on anything a manifest cannot hold
    json.dumps(report.cases)


@pytest.fixture(scope="module")
def tiny(tiny_demo_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_demo_dir, local_files_only=True)
    return AutoModelForCausalLM.from_pretrained(tiny_demo_dir, local_files_only=True), tokenizer


def test_tiny_model_gives_a_well_formed_report(tiny):
    model, tokenizer = tiny
    tokenizer.padding_side = "right"
    model.train()
    report = evaluate(model, tokenizer, demo_suite(), per_family=3, batch_size=5)
    _check_well_formed(report, 3)
    # evaluate restores what it changed on the caller's objects
    assert tokenizer.padding_side == "right" and model.training
    model.eval()
    for wrong in report.mistakes.values():
        assert len(wrong) <= 3 and all(set(w) == {"id", "question", "got", "why"} for w in wrong)
        assert all(w["why"][0].startswith("exact: expected") for w in wrong)


def test_evaluate_dir_loads_offline(tiny_demo_dir):
    _check_well_formed(evaluate_dir(tiny_demo_dir, demo_suite(), per_family=2), 2)


def test_sampled_and_raw_prompt_cases_and_a_text_perplexity(tiny, tmp_path):
    model, tokenizer = tiny
    (tmp_path / "text.txt").write_text("apple bird cake desk egg fish gold hill " * 20)
    sampled = {"temperature": 1.0, "seed": 3, "max_tokens": 8}
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(
        yaml.safe_dump(
            {
                "format": "aieng-suite/1",
                "name": "mixed",
                "version": 1,
                "perplexity": {"text": "text.txt"},
                "cases": [
                    {
                        "id": "s1",
                        "family": "f",
                        "prompt": "reverse: egg oak",
                        "sampling": sampled,
                        "expect": [{"max_length": 10_000}],
                    },
                    {
                        "id": "s2",
                        "family": "f",
                        "prompt": "reverse: egg oak",
                        "sampling": sampled,
                        "expect": [{"max_length": 0}],
                    },
                    {"id": "u1", "family": "g", "messages": [{"role": "user", "content": "sort: b a"}]},
                ],
            }
        )
    )
    suite = load_suite(suite_file)
    first, again = evaluate(model, tokenizer, suite), evaluate(model, tokenizer, suite)
    assert [c["answer"] for c in first.cases] == [c["answer"] for c in again.cases]  # seeded: reproducible
    assert first.accuracy == {"f": 0.5}  # g has no assertions: answered, not graded
    assert first.cases[2]["passed"] is None and first.text_perplexity == first.perplexity > 1.0


@pytest.fixture(scope="module")
def demo_report(demo_model_dir) -> EvalReport:
    """The full demo suite on the shipped demo model, run once for the quality bar and its time bound."""
    return evaluate_dir(demo_model_dir, demo_suite())


def test_demo_model_meets_the_quality_bar(demo_report):
    report = demo_report
    _check_well_formed(report, 50)
    strong = [f for f, acc in report.accuracy.items() if acc >= 0.9]
    assert len(strong) >= 2, report.accuracy
    # Chance is ~1 % for a two-digit sum and far lower for a word sequence: 0.3 is "clearly above".
    assert all(acc >= 0.3 for acc in report.accuracy.values()), (report.accuracy, report.mistakes)
    assert report.perplexity < 1.5


@pytest.mark.perf(alone=False)  # demo_report was timed beside the other worker: waiting now buys nothing
def test_the_demo_evaluation_takes_under_a_minute(demo_report):
    assert demo_report.seconds < 60
