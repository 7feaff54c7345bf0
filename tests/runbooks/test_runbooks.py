"""Runbooks executed for real with papermill against temporary stores."""

import nbformat
import pytest
from papermill.exceptions import PapermillExecutionError

from aieng.store import ModelRef, ModelStore
from aieng.workbook.runbooks import execute


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ModelStore(tmp_path_factory.mktemp("rb") / "store")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def _parameters_in(executed):
    nb = nbformat.read(executed, as_version=4)
    return nb.metadata["papermill"]["parameters"]


def _history_len(store, name="demo"):
    return len(store.history(name)) if name in store.names() else 0


def test_deploy_dry_run_changes_nothing_and_keeps_an_audit_copy(store, runs, demo_model_dir):
    params = {"source": str(demo_model_dir), "name": "demo", "version": "1", "store": str(store.root)}
    executed = execute("deploy_model", params, runs_dir=runs)
    assert store.versions("demo") == [] and store.current("demo") is None
    assert executed.parent == runs and executed.name.endswith("-deploy_model.ipynb")
    assert _parameters_in(executed)["source"] == str(demo_model_dir)  # the record holds the parameters
    assert "[dry run] would register" in executed.read_text()


def test_deploy_registers_evaluates_gates_and_promotes_then_rerun_is_a_no_op(store, runs, demo_model_dir):
    params = {
        "source": str(demo_model_dir),
        "name": "demo",
        "version": "1",
        "store": str(store.root),
        "dry_run": False,
        "n_per_family": 30,
    }
    executed = execute("deploy_model", params, runs_dir=runs)
    assert _parameters_in(executed)["version"] == "1"
    assert store.current("demo") == "1"
    manifest = store.manifest(ModelRef("demo", "1"))
    assert manifest.status == "stable" and manifest.eval["metrics"]["accuracy"]["reverse"] >= 0.9
    history = store.history("demo")

    execute("deploy_model", params, runs_dir=runs)  # idempotent re-run
    assert store.history("demo") == history
    assert len(list(runs.glob("*-deploy_model.ipynb"))) == 3


def test_deploy_gate_failure_keeps_current_and_leaves_a_candidate(store, runs, tiny_demo_dir):
    params = {
        "source": str(tiny_demo_dir),
        "name": "demo",
        "version": "2",
        "store": str(store.root),
        "dry_run": False,
        "n_per_family": 10,
    }
    with pytest.raises(PapermillExecutionError, match="eval gate failed"):
        execute("deploy_model", params, runs_dir=runs)
    assert store.current("demo") == "1"
    assert store.manifest(ModelRef("demo", "2")).status == "candidate"
    failed_copies = sorted(runs.glob("*-deploy_model.ipynb"))
    record = failed_copies[-1].read_text()
    assert "eval gate failed" in record  # the failed run is on record too
    assert "floor: reverse: " in record and "< 80%" in record  # naming the rule, the family and the floor


def test_deploy_refuses_force_without_a_reason_of_its_own_before_any_write(store, runs, tiny_demo_dir):
    before = (store.names(), _history_len(store))
    params = {"source": str(tiny_demo_dir), "name": "demo", "version": "9", "store": str(store.root)}
    with pytest.raises(PapermillExecutionError, match="force=True overrides the release gate"):
        execute("deploy_model", {**params, "dry_run": False, "force": True}, runs_dir=runs)
    assert (store.names(), _history_len(store)) == before
    assert not (store.root / "demo" / "versions" / "9").exists()


def test_deploy_refuses_a_reused_version_label_with_other_content(store, runs, tiny_demo_dir):
    params = {"source": str(tiny_demo_dir), "name": "demo", "version": "1", "store": str(store.root), "dry_run": False}
    with pytest.raises(PapermillExecutionError, match="different content"):
        execute("deploy_model", params, runs_dir=runs)
    assert store.current("demo") == "1"


def _outputs(executed) -> str:
    nb = nbformat.read(executed, as_version=4)
    return "".join(o.get("text", "") + str(o.get("evalue", "")) for c in nb.cells for o in c.get("outputs", []))


def test_rollback_runbook_dry_run_then_real_then_idempotent(store, runs):
    store.promote("demo", "2", reason="test: force the weak version live")
    base = {"name": "demo", "store": str(store.root)}

    dry = execute("rollback", base, runs_dir=runs)
    assert store.current("demo") == "2"
    assert "-p to_version 1" in _outputs(dry)  # the real run's command, target pinned

    before = _history_len(store)
    with pytest.raises(PapermillExecutionError, match="not pinned") as refused:  # a re-run would roll back further
        execute("rollback", {**base, "dry_run": False, "reason": "test"}, runs_dir=runs)
    assert "-p to_version 1" in str(refused.value) and store.current("demo") == "2"
    with pytest.raises(PapermillExecutionError, match="needs a reason"):
        execute("rollback", {**base, "dry_run": False, "to_version": "1"}, runs_dir=runs)
    assert _history_len(store) == before and store.current("demo") == "2"

    pinned = {**base, "dry_run": False, "to_version": "1", "reason": "test: weak answers"}
    execute("rollback", pinned, runs_dir=runs)
    assert store.current("demo") == "1"
    assert store.history("demo")[-1]["action"] == "rollback" and _history_len(store) == before + 1

    again = execute("rollback", pinned, runs_dir=runs)  # the same command after success: nothing changes
    assert _history_len(store) == before + 1 and "already current" in _outputs(again)


def test_rollback_runbook_aborts_an_active_canary_first_or_refuses_by_parameter(store, runs):
    from aieng.store.canary_record import read_canary, set_canary

    store.promote("demo", "2", reason="test: a version to roll back from")
    set_canary(store, "demo", "1", 0.1, reason="test: a canary in progress")
    params = {"name": "demo", "store": str(store.root), "dry_run": False, "to_version": "1", "reason": "test"}

    with pytest.raises(PapermillExecutionError, match="abort_canary=False"):
        execute("rollback", {**params, "abort_canary": False}, runs_dir=runs)
    assert store.current("demo") == "2" and read_canary(store, "demo") is not None

    execute("rollback", params, runs_dir=runs)
    assert store.current("demo") == "1" and read_canary(store, "demo") is None
    cleared, rolled = store.history("demo")[-2:]
    assert cleared["action"] == "canary_cleared" and cleared["reason"] == "canary aborted: rollback: test"
    assert rolled["action"] == "rollback" and rolled["to"] == "1"


def test_rollback_runbook_checks_the_server_before_it_writes(store, runs, monkeypatch):
    from aieng.bench.server_process import free_port

    store.promote("demo", "2", reason="test: a version to roll back from")
    params = {"name": "demo", "store": str(store.root), "dry_run": False, "to_version": "1", "reason": "test"}
    closed = f"http://127.0.0.1:{free_port()}"
    monkeypatch.delenv("AIENG_ADMIN_TOKEN", raising=False)
    with pytest.raises(PapermillExecutionError, match="AIENG_ADMIN_TOKEN is unset"):
        execute("rollback", {**params, "server_url": closed}, runs_dir=runs)
    monkeypatch.setenv("AIENG_ADMIN_TOKEN", "t")
    with pytest.raises(PapermillExecutionError, match="does not answer"):
        execute("rollback", {**params, "server_url": closed}, runs_dir=runs)
    assert store.current("demo") == "2"  # nothing was written


def test_rollback_runbook_fails_loudly_without_history(tmp_path, runs):
    with pytest.raises(PapermillExecutionError, match="not in"):
        execute("rollback", {"name": "demo", "store": str(tmp_path / "empty"), "dry_run": False}, runs_dir=runs)


def test_deploy_refuses_beside_a_canary_in_progress_before_any_write(tmp_path, runs, demo_model_dir):
    from aieng.store.canary_record import set_canary

    store = ModelStore(tmp_path / "store")
    for version in ("1", "2"):
        store.register(demo_model_dir, "demo", version)
    store.promote("demo", "1", reason="test: stable")
    set_canary(store, "demo", "2", 0.1, reason="test: a canary in progress")
    history = store.history("demo")
    params = {"source": str(demo_model_dir), "name": "demo", "version": "3", "store": str(store.root)}
    with pytest.raises(PapermillExecutionError, match="has a canary \\(2\\) in progress") as refused:
        execute("deploy_model", {**params, "dry_run": False}, runs_dir=runs)
    assert "aieng release canary demo --abort --reason WHY" in str(refused.value)
    assert store.versions("demo") == ["1", "2"] and store.history("demo") == history
    dry = execute("deploy_model", params, runs_dir=runs)  # a dry run reports it and goes on
    assert "canary 2 at 10%" in _outputs(dry)
