"""`aieng eval` bookkeeping: the full-precision result, then the int8 variant and its delta."""

import pytest

from aieng.errors import StoreError
from aieng.evaluation.record import evaluate_version
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
