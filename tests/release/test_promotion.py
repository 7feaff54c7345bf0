"""Promote through the gate: refusals change nothing but history, --force needs a reason and is recorded."""

import json

import pytest

from aieng.cli.main import main
from aieng.errors import GateRefusedError, StoreError
from aieng.release.promotion import promote
from aieng.store import ModelRef, ModelStore

GOOD = {"reverse": 1.0, "json": 0.96, "add": 0.98, "sort": 1.0}


def _record_eval(store, version, accuracy, perplexity=1.01, template="shipped"):
    manifest = store.manifest(ModelRef("tiny", version))
    sha = manifest.prompt_template["sha256"] if template == "shipped" else template
    store.update_manifest(
        ModelRef("tiny", version),
        eval={
            "suite": "demo-heldout-v1",
            "metrics": {"accuracy": accuracy, "perplexity": perplexity},
            "n_per_family": 50,
            "template_sha256": sha,
        },
    )


@pytest.fixture()
def store(tmp_path, tiny_demo_dir):
    store = ModelStore(tmp_path / "store")
    for version in ("1", "2"):
        store.register(tiny_demo_dir, "tiny", version)
    _record_eval(store, "1", GOOD)
    promote(store, "tiny", "1", reason="first")
    return store


def test_a_passing_candidate_is_promoted_with_the_decision_in_manifest_and_history(store):
    _record_eval(store, "2", {**GOOD, "add": 1.0})
    result = promote(store, "tiny", "2", reason="better add", actor="alice")
    assert store.current("tiny") == "2" and not result.forced
    recorded = store.manifest(ModelRef("tiny", "2")).release_gate
    assert recorded["decision"]["passed"] and recorded["against"] == "1" and recorded["actor"] == "alice"
    assert recorded["thresholds"]["floors"] == {"reverse": 0.8, "json": 0.8}  # the registered suite's
    assert recorded["decision"]["compared"]["eval"]
    event = store.history("tiny")[-1]
    assert event["action"] == "promote" and event["gate"] == recorded and event["reason"] == "better add"


def test_a_regressed_candidate_is_refused_naming_the_rule_and_nothing_switches(store):
    _record_eval(store, "2", {**GOOD, "json": 0.5})
    before = store.manifest(ModelRef("tiny", "2")).to_dict()
    with pytest.raises(GateRefusedError, match=r"rules: floor, regression\): floor: json: 50.0% < 80%") as refused:
        promote(store, "tiny", "2", actor="bob")
    assert refused.value.decision.rules_fired == ["floor", "regression"]
    assert store.current("tiny") == "1"
    assert store.manifest(ModelRef("tiny", "2")).to_dict() == before  # still a candidate, untouched
    event = store.history("tiny")[-1]
    assert event["action"] == "gate_refused" and event["to"] == "2" and event["actor"] == "bob"
    assert [f["rule"] for f in event["gate"]["decision"]["failures"]] == ["floor", "regression"]
    assert store.rollback_target("tiny", "2") == "2"  # a refusal is not a promotion in the stack
    with pytest.raises(StoreError, match="no previous promoted version"):
        store.rollback_target("tiny")


def test_force_needs_a_reason_and_is_recorded_as_an_override(store):
    _record_eval(store, "2", {**GOOD, "json": 0.5})
    with pytest.raises(StoreError, match="needs --reason"):
        promote(store, "tiny", "2", force=True)
    assert store.current("tiny") == "1"
    result = promote(store, "tiny", "2", force=True, reason="hotfix for the outage, eval later", actor="carol")
    assert result.forced and store.current("tiny") == "2"
    gate = store.history("tiny")[-1]["gate"]
    assert gate["forced"] and gate["actor"] == "carol" and gate["reason"].startswith("hotfix")
    assert store.manifest(ModelRef("tiny", "2")).release_gate == gate


def test_a_candidate_never_evaluated_is_refused_unless_forced(store):
    with pytest.raises(
        GateRefusedError,
        match=r"rules: evidence\): evidence: 2 has no graded evaluation and no comparison with current 1",
    ):
        promote(store, "tiny", "2")
    assert promote(store, "tiny", "2", force=True, reason="evaluated elsewhere").forced


def test_a_template_changed_since_the_evaluation_is_refused(store):
    _record_eval(store, "2", GOOD, template="0" * 64)
    with pytest.raises(GateRefusedError, match="rules: template"):
        promote(store, "tiny", "2")


def test_the_cli_exits_1_naming_the_rule_and_history_shows_the_override(store, capsys):
    _record_eval(store, "2", GOOD, perplexity=5.0)
    args = ["--store", str(store.root), "model", "promote", "tiny", "2"]
    assert main(args) == 1
    assert "rules: perplexity" in capsys.readouterr().err and store.current("tiny") == "1"
    assert main(args + ["--max-perplexity", "6", "--max-perplexity-rise", "10"]) == 0
    assert store.current("tiny") == "2" and "gate passed" in capsys.readouterr().out
    assert main(["--store", str(store.root), "model", "rollback", "tiny"]) == 0
    _record_eval(store, "2", {**GOOD, "reverse": 0.0})
    assert main(args + ["--force", "--reason", "testing the override"]) == 0
    assert "gate FAILED and was overridden" in capsys.readouterr().err
    assert main(["--store", str(store.root), "model", "history", "tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "[gate refused: perplexity]" in lines[1] and "[gate passed]" in lines[2]
    assert "[gate overridden: floor, regression]" in lines[-1]
    assert json.loads(store.history_path("tiny").read_text().splitlines()[-1])["gate"]["forced"] is True
