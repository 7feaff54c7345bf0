"""The comparison gate on a model without labels (a random-weight shape, a prompts-only suite): an
exact copy passes, a copy with one layer perturbed is refused naming the changed cases, and a
version with no evidence can only be forced."""

import pytest
import yaml

from aieng.demo.degrade import perturbed_copy
from aieng.demo.shapes import build_shape_model
from aieng.errors import GateRefusedError, SuiteError
from aieng.evaluation.answers import Answer
from aieng.evaluation.compare import compare_versions, comparison_metrics, prompt_file_cases
from aieng.evaluation.suite_file import Case
from aieng.release.promotion import promote
from aieng.store import ModelRef, ModelStore

QUESTIONS = ["reverse: egg oak van", "sort: pen oak ice", "json: name=moon", "add: 12+7", "你好，请介绍一下你自己"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    model = build_shape_model(root / "v1", "tiny", seed=1)
    suite = root / "prompts.yaml"
    cases = [
        {"id": f"q{i}", "family": "chat", "messages": [{"role": "user", "content": q}]} for i, q in enumerate(QUESTIONS)
    ]
    document = {"format": "aieng-suite/1", "name": "prompts", "version": 1, "defaults": {"max_tokens": 12}}
    suite.write_text(yaml.safe_dump({**document, "cases": cases}, allow_unicode=True))
    store = ModelStore(root / "store")
    store.register(model, "mine", "1", suite=suite)
    store.promote("mine", "1")
    store.register(model, "mine", "2", suite=suite)  # an exact copy
    store.register(perturbed_copy(model, root / "v3", only="layers.1.", noise=2.0), "mine", "3", suite=suite)
    return store


def test_an_exact_copy_agrees_everywhere_and_is_promoted(store):
    result = compare_versions(store, "mine", "2", suite=store.suite(ModelRef("mine", "2")))
    m = result["metrics"]
    assert result["against"] == "1" and m["cases"] == len(QUESTIONS)
    assert (m["agreement"], m["length_ratio"], m["changed"]) == (1.0, 1.0, 0)
    assert m["perplexity_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert store.manifest(ModelRef("mine", "2")).comparison["metrics"] == m
    assert not promote(store, "mine", "2", reason="copy").forced
    store.rollback("mine", "1")


def test_one_perturbed_layer_is_refused_naming_the_changed_cases(store):
    result = compare_versions(store, "mine", "3", suite=store.suite(ModelRef("mine", "3")))
    m = result["metrics"]
    # Random weights: the answers change; their perplexity ratio need not rise (a near-uniform model
    # finds everything about equally unlikely), so agreement is what refuses it here.
    assert m["agreement"] < 0.9 and m["changed"] >= 1 and m["perplexity_ratio"] != pytest.approx(1.0), m
    assert result["changed"] and {"id", "question", "stable", "candidate"} <= set(result["changed"][0])
    with pytest.raises(GateRefusedError) as refused:
        promote(store, "mine", "3", reason="try")
    message = str(refused.value)
    assert "comparison: agreement" in message and result["changed"][0]["id"] in message
    assert store.current("mine") == "1"


def test_without_a_comparison_or_labels_only_force_promotes(tmp_path, store):
    other = ModelStore(tmp_path / "other")
    other.register(store.version_dir("mine", "2"), "mine", "1")
    with pytest.raises(GateRefusedError, match="evidence: 1 has no graded evaluation"):
        promote(other, "mine", "1", reason="first")
    assert promote(other, "mine", "1", force=True, reason="first release, reviewed by hand").forced


def test_bad_comparison_requests_are_refused(store, tmp_path):
    with pytest.raises(SuiteError, match="is the version to compare with"):
        compare_versions(store, "mine", "1", suite=store.suite(ModelRef("mine", "1")))
    with pytest.raises(SuiteError, match="nothing to compare"):
        compare_versions(store, "mine", "2")
    (tmp_path / "bad.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(SuiteError, match="bad.jsonl:1: not a prompt record"):
        compare_versions(store, "mine", "2", prompts=tmp_path / "bad.jsonl")


def test_prompt_files_and_metrics():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        text = Path(folder) / "p.txt"
        text.write_text("one\n\ntwo\n")
        assert [c.messages[0]["content"] for c in prompt_file_cases(text)] == ["one", "two"]
        lines = Path(folder) / "p.jsonl"
        lines.write_text('{"prompt": "raw"}\n{"messages": [{"role": "user", "content": "hi"}], "t": 1.5}\n')
        cases = prompt_file_cases(lines)
        assert cases[0].prompt == "raw" and cases[1].messages == ({"role": "user", "content": "hi"},)
    cases = [Case(f"c{i}", "f", None, "q", {}) for i in range(4)]
    stable = [Answer("a", 2), Answer("b", 2), Answer("", 0), Answer("c", 4)]
    candidate = [Answer("a", 2), Answer("I'm sorry, I cannot", 4), Answer("", 0), Answer("抱歉", 2)]
    m, changed = comparison_metrics(cases, stable, candidate)
    assert m["agreement"] == 0.5 and [c["id"] for c in changed] == ["c1", "c3"]
    assert m["length_ratio"] == 1.0 and m["empty_rate"] == m["stable_empty_rate"] == 0.25
    assert m["refusal_rate"] == 0.5 and m["stable_refusal_rate"] == 0.0 and m["perplexity_ratio"] is None
