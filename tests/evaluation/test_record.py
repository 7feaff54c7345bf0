"""`aieng eval` bookkeeping: the full-precision result, then the int8 variant and its delta."""

import pytest

from aieng.errors import StoreError
from aieng.evaluation.record import evaluate_version, same_answers
from aieng.store import ModelRef, ModelStore


@pytest.fixture()
def store(tmp_path, tiny_demo_dir):
    store = ModelStore(tmp_path / "store")
    store.register(tiny_demo_dir, "tiny", "1")
    return store


def test_int8_needs_a_full_precision_result_first(store):
    with pytest.raises(StoreError, match="aieng eval tiny@1"):
        evaluate_version(store, ModelRef("tiny", "1"), n_per_family=2, int8=True)
    assert store.manifest(ModelRef("tiny", "1")).eval is None


def test_int8_result_and_delta_are_recorded_beside_the_full_precision_one(store):
    ref = ModelRef("tiny", "1")
    base = evaluate_version(store, ref, n_per_family=4)
    result = evaluate_version(store, ref, n_per_family=4, int8=True)
    recorded = store.manifest(ref).eval
    assert recorded["metrics"] == base["metrics"]  # the full-precision numbers are left alone
    assert recorded["template_sha256"] == store.manifest(ref).prompt_template["sha256"]  # what the gate ties
    int8 = recorded["variants"]["int8"]
    for family, accuracy in int8["metrics"]["accuracy"].items():
        assert int8["delta"]["accuracy"][family] == pytest.approx(
            accuracy - base["metrics"]["accuracy"][family], abs=1e-4
        )
    assert int8["delta"]["perplexity"] == pytest.approx(
        int8["metrics"]["perplexity"] - base["metrics"]["perplexity"], abs=1e-3
    )
    assert result["int8"] is True
    again = evaluate_version(store, ref, n_per_family=4)  # re-running full precision keeps the variant
    assert store.manifest(ref).eval["variants"]["int8"] == int8 and again["variants"]["int8"] == int8


def test_int8_refuses_a_delta_against_a_different_prompt_set(store):
    ref = ModelRef("tiny", "1")
    evaluate_version(store, ref, n_per_family=4)
    with pytest.raises(StoreError, match="--n-per-family 4"):
        evaluate_version(store, ref, n_per_family=2, int8=True)
    assert "variants" not in store.manifest(ref).eval


def test_the_bf16_kv_cache_variant_is_recorded_and_its_rounding_is_undone_afterwards(store):
    """``aieng eval --kv-cache-dtype bfloat16``: its own entry and delta; the model is left as it was."""
    from aieng.evaluation.kv_rounding import bf16_kv_rounding
    from aieng.loading.loader import load_version

    ref = ModelRef("tiny", "1")
    base = evaluate_version(store, ref, n_per_family=4)
    result = evaluate_version(store, ref, n_per_family=4, variant="kv_bfloat16")
    entry = store.manifest(ref).eval["variants"]["kv_bfloat16"]
    assert result["variant"] == "kv_bfloat16" and entry["metrics"] == result["metrics"]
    assert entry["delta"]["perplexity"] == pytest.approx(
        entry["metrics"]["perplexity"] - base["metrics"]["perplexity"], abs=1e-3
    )
    assert entry["metrics"]["perplexity"] != base["metrics"]["perplexity"]  # the rounding did reach the attention

    model = load_version(store, ref).model
    ids = __import__("torch").tensor([[5, 9, 11, 13, 17]])
    before = model(input_ids=ids).logits
    with bf16_kv_rounding(model):
        rounded = model(input_ids=ids).logits
    after = model(input_ids=ids).logits
    assert not rounded.equal(before) and after.equal(before)


@pytest.mark.parametrize("variant", ["int8_weights", "int4_weights"])
def test_a_weights_variant_grades_the_rounding_serving_runs_and_undoes_it(store, variant):
    """``aieng eval --dtype int8|int4``: the layers' and the output projection's weights (and, for
    int4, their inputs) rounded as AIENG_WEIGHT_FORMATS rounds them, recorded with its delta; the
    model is left as it was."""
    import torch

    from aieng.engine.native import int4_weights, int8_weights
    from aieng.engine.native.quantized import quantized_linears
    from aieng.loading.loader import load_version

    ref = ModelRef("tiny", "1")
    base = evaluate_version(store, ref, n_per_family=4)
    result = evaluate_version(store, ref, n_per_family=4, variant=variant)
    entry = store.manifest(ref).eval["variants"][variant]
    assert result["variant"] == variant and entry["metrics"] == result["metrics"]
    assert entry["delta"]["perplexity"] == pytest.approx(
        entry["metrics"]["perplexity"] - base["metrics"]["perplexity"], abs=1e-3
    )
    greedy = [case for case in base["cases"] if case["id"] in {c.id for c in suite_cases(store, ref) if c.greedy}]
    agreement = entry["agreement"]
    assert agreement["greedy_cases"] == len(greedy) > 0 and 0.0 <= agreement["same_answer"] <= 1.0
    assert set(agreement["changed"]) <= {case["id"] for case in greedy}

    fmt = int8_weights if variant == "int8_weights" else int4_weights
    rounds_input = getattr(fmt, "round_input", lambda x: x)
    model = load_version(store, ref).model
    ids = torch.tensor([[5, 9, 11, 13, 17]])
    before = model(input_ids=ids).logits
    with quantized_linears(model, variant.split("_")[0]):
        rounded = model(input_ids=ids).logits
        down = model.model.layers[0].mlp.down_proj  # 64 inputs on the tiny model: both formats take it
        x = torch.randn(2, down.in_features)
        torch.testing.assert_close(down(x), rounds_input(x) @ fmt.dequantize(*fmt.quantize(down.weight)).T)
    after = model(input_ids=ids).logits
    assert not rounded.equal(before) and after.equal(before)


def test_the_suite_travels_with_the_version_and_grades_it(store, tmp_path):
    """A demo build carries eval-suite/suite.yaml: registered, hashed like weights, used by eval."""
    from aieng.demo.heldout_suite import demo_suite

    ref = ModelRef("tiny", "1")
    manifest = store.manifest(ref)
    assert manifest.suite["label"] == "demo-heldout-v1" and manifest.suite["sha256"] == demo_suite().sha256
    assert manifest.suite["thresholds"]["floors"] == {"reverse": 0.8, "json": 0.8}
    assert "eval-suite/suite.yaml" in manifest.files
    result = evaluate_version(store, ref, n_per_family=2)
    recorded = store.manifest(ref).eval
    assert recorded["suite_sha256"] == demo_suite().sha256 and len(recorded["cases"]) == 8
    assert {"id", "family", "passed", "failures", "answer"} == set(recorded["cases"][0])
    assert result["n_per_family"] == 2 and recorded["where"] == "in process"
    suite_copy = store.version_dir("tiny", "1") / "eval-suite" / "suite.yaml"
    suite_copy.chmod(0o644)
    suite_copy.write_text(suite_copy.read_text().replace("exact: star", "exact: moon"))
    assert any("eval-suite/suite.yaml" in p for p in store.verify(ref).problems)  # an edited suite is caught


def test_a_version_without_a_suite_says_how_to_give_one(tmp_path, tiny_demo_dir):
    import shutil

    from aieng.errors import SuiteError

    bare = tmp_path / "bare"
    shutil.copytree(tiny_demo_dir, bare, ignore=shutil.ignore_patterns("eval-suite"))
    store = ModelStore(tmp_path / "store")
    assert store.register(bare, "mine", "1").suite is None
    with pytest.raises(SuiteError, match=r"--suite FILE.*--suite FILE.*--compare"):
        evaluate_version(store, ModelRef("mine", "1"))
    assert store.manifest(ModelRef("mine", "1")).eval is None


def test_register_with_a_bad_suite_refuses_before_copying(tmp_path, tiny_demo_dir):
    from aieng.errors import SuiteError

    (tmp_path / "bad.yaml").write_text("format: aieng-suite/1\nname: x\nversion: 1\ncases: []\n")
    store = ModelStore(tmp_path / "store")
    with pytest.raises(SuiteError, match="should be non-empty"):
        store.register(tiny_demo_dir, "tiny", "1", suite=tmp_path / "bad.yaml")
    assert store.versions("tiny") == []


def test_register_suite_replaces_the_folders_own_and_keeps_its_text(tmp_path, tiny_demo_dir):
    import yaml

    (tmp_path / "words.txt").write_text("apple bird cake " * 30)
    document = {
        "format": "aieng-suite/1",
        "name": "mine",
        "version": 3,
        "perplexity": {"text": "../suites/words.txt"},
        "thresholds": {"max_perplexity": 1000, "comparison": {"min_agreement": 0.95}},
        "cases": [{"id": "a", "family": "f", "prompt": "reverse: egg oak"}],
    }
    (tmp_path / "suites").mkdir()
    (tmp_path / "suites" / "words.txt").write_text((tmp_path / "words.txt").read_text())
    (tmp_path / "defs").mkdir()
    (tmp_path / "defs" / "mine.yaml").write_text(yaml.safe_dump(document))
    store = ModelStore(tmp_path / "store")
    manifest = store.register(tiny_demo_dir, "tiny", "1", suite=tmp_path / "defs" / "mine.yaml")
    stored = store.suite(ModelRef("tiny", "1"))
    assert manifest.suite["label"] == "mine-v3" and stored.sha256 == manifest.suite["sha256"]
    assert stored.perplexity_text.parent == store.version_dir("tiny", "1") / "eval-suite"
    assert not manifest.suite["labelled"] and "eval-suite/words.txt" in manifest.files
    from aieng.release.promotion import thresholds_for

    thresholds = thresholds_for(store, "tiny", "1", {"max_regression": 0.01})
    assert thresholds.min_agreement == 0.95 and thresholds.max_perplexity == 1000 and thresholds.max_regression == 0.01
    result = evaluate_version(store, ModelRef("tiny", "1"))
    assert result["metrics"]["accuracy"] == {} and result["metrics"]["text_perplexity"] > 1


def suite_cases(store, ref, n_per_family=4):
    from aieng.evaluation.record import suite_for

    return suite_for(store, ref).gate_cases(n_per_family)


def test_agreement_counts_greedy_answers_equal_to_full_precision_and_names_the_changed():
    full = [
        {"id": "a", "answer": "x"},
        {"id": "b", "answer": "y"},
        {"id": "c", "answer": "z"},
        {"id": "s", "answer": "q"},
    ]
    rounded = [
        {"id": "a", "answer": "x"},
        {"id": "b", "answer": "y!"},
        {"id": "c", "answer": "z"},
        {"id": "s", "answer": "?"},
    ]
    same = same_answers(full, rounded, greedy={"a", "b", "c"})  # "s" is sampled: not compared
    assert same == {"greedy_cases": 3, "same_answer": pytest.approx(2 / 3, abs=1e-4), "changed": ["b"]}
    assert same_answers(full, full, greedy={"a", "b", "c", "s"})["same_answer"] == 1.0
    assert same_answers([], rounded, greedy={"a"}) == {"greedy_cases": 0, "same_answer": None, "changed": []}
