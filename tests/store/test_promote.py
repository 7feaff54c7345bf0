import multiprocessing
import os

import pytest

from aieng.errors import StoreError, VerificationError
from aieng.store import ModelRef, ModelStore


@pytest.fixture
def three_versions(store, tiny_llama):
    for version in ("1", "2", "3"):
        store.register(tiny_llama, "tiny", version)
    return store


def test_promote_switches_current_with_a_symlink_and_records_history(three_versions):
    store = three_versions
    store.promote("tiny", "1", reason="first")
    event = store.promote("tiny", "2", reason="better eval")
    link = store.model_dir("tiny") / "current"
    assert link.is_symlink() and os.readlink(link) == "versions/2"
    assert (link / "config.json").is_file()
    assert event["from"] == "1" and event["to"] == "2" and event["reason"] == "better eval"
    history = store.history("tiny")
    assert [(e["action"], e["from"], e["to"]) for e in history] == [("promote", None, "1"), ("promote", "1", "2")]
    assert all({"ts", "actor", "reason"} <= set(e) for e in history)
    assert store.manifest(ModelRef("tiny", "2")).status == "stable"
    assert not list(store.model_dir("tiny").glob(".current-*"))  # no temp links left


def test_promote_refuses_a_tampered_version(three_versions):
    store = three_versions
    store.promote("tiny", "1")
    weights = store.version_dir("tiny", "2") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(VerificationError, match="model.safetensors"):
        store.promote("tiny", "2")
    assert store.current("tiny") == "1"


def test_rollback_goes_to_the_previous_promotion_then_further(three_versions):
    store = three_versions
    for version in ("1", "2", "3"):
        store.promote("tiny", version)
    assert store.rollback("tiny")["to"] == "2"
    assert store.manifest(ModelRef("tiny", "3")).status == "retired"
    assert store.rollback("tiny")["to"] == "1"
    with pytest.raises(StoreError, match="no previous promoted version"):
        store.rollback("tiny")
    assert store.current("tiny") == "1"


def test_rollback_without_history_is_a_clear_error(three_versions):
    store = three_versions
    with pytest.raises(StoreError, match="no previous promoted version"):
        store.rollback("tiny")
    store.promote("tiny", "1")
    with pytest.raises(StoreError, match="no previous promoted version"):
        store.rollback("tiny")
    assert store.current("tiny") == "1"


def test_rollback_to_a_named_version(three_versions):
    store = three_versions
    store.promote("tiny", "3")
    assert store.rollback("tiny", to="1")["to"] == "1"
    with pytest.raises(StoreError, match="already current"):
        store.rollback("tiny", to="1")


def test_rollback_skips_removed_versions(three_versions):
    store = three_versions
    for version in ("1", "2", "3"):
        store.promote("tiny", version)
    store.remove("tiny", "2")
    assert store.rollback("tiny")["to"] == "1"


def test_remove_refuses_current_and_deletes_others(three_versions):
    store = three_versions
    store.promote("tiny", "1")
    with pytest.raises(StoreError, match="is current"):
        store.remove("tiny", "1")
    store.remove("tiny", "2")
    assert store.versions("tiny") == ["1", "3"]
    assert not list((store.model_dir("tiny") / "versions").glob(".removing-*"))


def _promote_many(root, version, rounds):
    store = ModelStore(root)
    for _ in range(rounds):
        store.promote("tiny", version)


def test_concurrent_promotes_leave_a_valid_current_and_whole_history(three_versions):
    store = three_versions
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_promote_many, args=(store.root, v, 5)) for v in ("1", "2", "3")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    assert store.current("tiny") in {"1", "2", "3"}
    assert (store.model_dir("tiny") / "current" / "model.safetensors").is_file()
    history = store.history("tiny")
    assert len(history) == 15  # every line whole: json.loads above would have failed on an interleaved line
    # each event's `from` is the previous event's `to`: promotes were serialised
    assert all(a["to"] == b["from"] for a, b in zip(history, history[1:]))


def test_update_manifest_only_touches_mutable_fields(three_versions):
    store = three_versions
    store.update_manifest(ModelRef("tiny", "1"), eval={"suite": "x", "metrics": {"accuracy": {"a": 1.0}}})
    assert store.manifest(ModelRef("tiny", "1")).eval["suite"] == "x"
    assert store.verify(ModelRef("tiny", "1")).ok
    with pytest.raises(StoreError, match="can change"):
        store.update_manifest(ModelRef("tiny", "1"), files={})


def test_rollback_walks_back_through_repeated_promotions_one_step_at_a_time(three_versions):
    store = three_versions
    for version in ("1", "2", "1", "2", "2"):  # the last promote repeats the current version: no step
        store.promote("tiny", version)
    walked = []
    for _ in range(3):
        walked.append(store.rollback("tiny")["to"])
    assert walked == ["1", "2", "1"]
    with pytest.raises(StoreError, match="no previous promoted version"):
        store.rollback("tiny")
