"""The runbooks played against a real 2-worker server, failures first: a server that is down, a
missing or wrong admin token, a hot swap that fails after the store moved, a re-run after a partial
failure and after success, a rollback with a live canary. Each play ends in the state and the
message the runbook promises, and its executed copy says what was checked, what changed and what
to run next."""

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from papermill.exceptions import PapermillExecutionError

from aieng.bench.server_process import free_port
from aieng.release.reload import reload_server, worker_canaries, worker_versions
from aieng.store import ModelRef
from aieng.workbook.runbooks import execute

from ...polling import poll
from ...suites import write_prompts_only_suite
from .conftest import ADMIN_TOKEN

EVAL = {
    "suite": "demo-heldout-v1",
    "n_per_family": 50,
    "metrics": {"accuracy": {"reverse": 1.0, "json": 1.0, "add": 0.98, "sort": 1.0}, "perplexity": 1.01},
}


def outputs(executed: Path) -> str:
    nb = nbformat.read(executed, as_version=4)
    return "".join(o.get("text", "") + str(o.get("evalue", "")) for c in nb.cells for o in c.get("outputs", []))


def with_eval(store, version: str) -> None:
    """A recorded evaluation, as if ``aieng eval`` had run (the plays are about the server, not the eval)."""
    manifest = store.manifest(ModelRef("demo", version))
    template = (manifest.prompt_template or {}).get("sha256")
    suite = (manifest.suite or {}).get("sha256")  # measured on the suite registered with it
    store.update_manifest(ModelRef("demo", version), eval={**EVAL, "template_sha256": template, "suite_sha256": suite})


@pytest.fixture
def at_version_1(server, store, monkeypatch):
    """Each play starts with demo@1 current and served by both workers, no canary, the right token."""
    from aieng.store.canary_record import clear_canary

    monkeypatch.setenv("AIENG_ADMIN_TOKEN", ADMIN_TOKEN)
    clear_canary(store, "demo", reason="test: reset")
    if store.current("demo") != "1":
        store.rollback("demo", "1", reason="test: reset")
    reload_server(server.base_url, "1", timeout_s=120)
    return {"name": "demo", "store": str(store.root), "server_url": server.base_url, "dry_run": False}


def test_deploy_checks_the_server_and_its_token_before_it_writes(at_version_1, store, demo_model_dir, tmp_path):
    params = {**at_version_1, "source": str(demo_model_dir), "version": "3"}
    before = (store.versions("demo"), store.history("demo"))
    closed = f"http://127.0.0.1:{free_port()}"
    plays = [
        ({"server_url": closed}, {}, "does not answer"),
        ({}, {"AIENG_ADMIN_TOKEN": ""}, "AIENG_ADMIN_TOKEN is unset"),
        ({}, {"AIENG_ADMIN_TOKEN": "not-the-servers"}, "refuses this AIENG_ADMIN_TOKEN \\(403\\)"),
    ]
    for overrides, env, message in plays:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            with pytest.raises(PapermillExecutionError, match=message):
                execute("deploy_model", {**params, **overrides}, runs_dir=tmp_path)
        assert (store.versions("demo"), store.history("demo")) == before, message  # nothing written
    assert not (store.root / "demo" / "versions" / "3").exists()


def test_deploy_swaps_watches_and_a_rerun_after_success_changes_nothing(at_version_1, store, server, tmp_path):
    with_eval(store, "1")
    with_eval(store, "2")
    source = store.version_dir("demo", "2")  # the registered files: the runbook reuses the version
    params = {**at_version_1, "source": str(source), "version": "2", "watch_window_s": 1, "watch_interval_s": 0.5}
    record = outputs(execute("deploy_model", params, runs_dir=tmp_path))
    assert "answers, accepts the admin token, serves demo@1" in record
    assert "serves demo@2 on every worker (no restart)" in record
    assert "[watch demo@2]" in record and ("held for 1 s" in record or "undecided after the watch" in record)
    assert store.history("demo")[-1]["action"] in ("watch_confirmed", "watch_undecided")
    assert set(worker_versions(server.base_url).values()) == {"2"}

    history = store.history("demo")
    again = outputs(execute("deploy_model", params, runs_dir=tmp_path))
    assert "already current: nothing to promote" in again and "nothing new to watch" in again
    assert store.history("demo") == history


def test_a_deploy_without_labels_compares_records_what_stable_served_and_the_watch_is_held_to_it(
    at_version_1, store, server, demo_model_dir, tmp_path
):
    """A version whose suite has only prompts: the gate compares its answers with v1's in process,
    the runbook records what v1 serves to its probe before the swap, and after the swap, with v1
    no longer served, the watch judges the new version's live answers by agreement with those."""
    suite = write_prompts_only_suite(tmp_path / "prompts.yaml")
    with_eval(store, "1")
    params = {**at_version_1, "source": str(demo_model_dir), "version": "8", "suite": str(suite)}
    record = outputs(
        execute("deploy_model", {**params, "watch_window_s": 1, "watch_interval_s": 0.5}, runs_dir=tmp_path)
    )
    assert '"agreement": 1.0' in record  # the comparison gate, an exact copy
    assert "recorded demo@1's served answers to 8's probe sample (5 kept)" in record
    assert "100% of 5 answers agree with demo@1's served answers" in record
    assert store.current("demo") == "8" and set(worker_versions(server.base_url).values()) == {"8"}
    assert store.manifest(ModelRef("demo", "8")).served_answers["by"] == "watch"


def test_a_hot_swap_that_fails_after_promotion_prints_the_undo_and_the_undo_restores_agreement(
    at_version_1, store, server, demo_model_dir, tmp_path
):
    """Hashes fine, eval recorded, but the weights do not fit the config: the store moves, the server
    refuses the version and keeps serving 1; the printed command puts the store back."""
    broken = Path(shutil.copytree(demo_model_dir, tmp_path / "broken"))
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] *= 2
    (broken / "config.json").write_text(json.dumps(config))
    store.register(broken, "demo", "5")
    with_eval(store, "1")
    with_eval(store, "5")
    params = {**at_version_1, "source": str(broken), "version": "5", "watch_window_s": 0}

    with pytest.raises(PapermillExecutionError) as failed:
        execute("deploy_model", params, runs_dir=tmp_path)
    record = outputs(failed.value.executed_path)
    assert "FAILED: the store says demo@5 is current" in record and "still serves ['1']" in record
    assert store.current("demo") == "5" and set(worker_versions(server.base_url).values()) == {"1"}
    undo = next(line.strip() for line in record.splitlines() if "papermill runbooks/rollback.ipynb" in line)
    assert "-p to_version 1" in undo and "-p reason 'undo deploy of 5: hot swap failed'" in undo

    execute(
        "rollback",
        {**at_version_1, "to_version": "1", "reason": "undo deploy of 5: hot swap failed"},
        runs_dir=tmp_path,
    )
    assert store.current("demo") == "1" and set(worker_versions(server.base_url).values()) == {"1"}
    assert store.history("demo")[-1]["reason"] == "undo deploy of 5: hot swap failed"

    # The same failure reached by a rollback (to a version that was current once): retry and undo printed.
    rollback = {**at_version_1, "to_version": "5", "reason": "test: back to 5"}
    with pytest.raises(PapermillExecutionError, match="the server refused 5") as failed:
        execute("rollback", rollback, runs_dir=tmp_path)
    record = outputs(failed.value.executed_path)
    assert "FAILED: the store says demo@5, but the hot swap" in record and "-p to_version 1" in record
    assert store.current("demo") == "5" and set(worker_versions(server.base_url).values()) == {"1"}


def test_a_gate_refusal_then_a_rerun_with_a_reason_completes_the_deploy(at_version_1, store, server, tmp_path):
    """A re-run after a partial failure: registered and evaluated by the first run, refused by the gate;
    the second run reuses both, overrides with a reason and finishes the swap."""
    from aieng.store.canary_record import read_canary

    store.register(store.version_dir("demo", "2"), "demo", "6")
    with_eval(store, "1")
    with_eval(store, "6")  # measured on the registered suite, so both runs reuse it rather than re-evaluate
    weak = store.manifest(ModelRef("demo", "6")).eval
    weak["metrics"]["accuracy"]["reverse"] = 0.1
    store.update_manifest(ModelRef("demo", "6"), eval=weak)
    params = {**at_version_1, "source": str(store.version_dir("demo", "6")), "version": "6", "watch_window_s": 0}

    with pytest.raises(PapermillExecutionError, match="eval gate failed"):
        execute("deploy_model", params, runs_dir=tmp_path)
    assert store.current("demo") == "1" and set(worker_versions(server.base_url).values()) == {"1"}

    forced = {**params, "force": True, "reason": "test: accepted weaker reverse for this play"}
    record = outputs(execute("deploy_model", forced, runs_dir=tmp_path))
    assert "is already registered with identical files (candidate): will reuse it" in record
    assert '"reverse": 0.1' in record  # the recorded evaluation, not a new one
    assert "gate FAILED, overridden (force=True)" in record and "aieng release watch demo --url" in record
    assert store.current("demo") == "6" and set(worker_versions(server.base_url).values()) == {"6"}
    promoted = store.history("demo")[-1]
    assert promoted["reason"] == "test: accepted weaker reverse for this play" and read_canary(store, "demo") is None


def test_rollback_with_a_live_canary_aborts_it_on_every_worker_first(at_version_1, store, server, tmp_path):
    from aieng.store.canary_record import read_canary, set_canary

    with_eval(store, "2")
    store.promote("demo", "2", reason="test: a version to roll back from")
    reload_server(server.base_url, "2", timeout_s=120)
    set_canary(store, "demo", "1", 0.5, reason="test: a canary in progress")
    assert poll(lambda: len(worker_canaries(server.base_url)) == 2, timeout=120)  # both workers serve it

    params = {**at_version_1, "to_version": "1", "reason": "test: incident during a canary"}
    record = outputs(execute("rollback", params, runs_dir=tmp_path))
    assert "canary 1 cleared" in record and "no worker serves a canary of demo" in record
    assert "serves demo@1 on every worker (no restart)" in record
    assert read_canary(store, "demo") is None and worker_canaries(server.base_url) == {}
    assert store.current("demo") == "1" and set(worker_versions(server.base_url).values()) == {"1"}


def test_the_canary_runbook_aborts_a_canary_in_progress_once(at_version_1, store, server, tmp_path):
    from aieng.store.canary_record import read_canary, set_canary

    set_canary(store, "demo", "2", 0.5, reason="test: a canary in progress")
    assert poll(lambda: len(worker_canaries(server.base_url)) == 2, timeout=120)
    params = {**at_version_1, "abort": True}
    with pytest.raises(PapermillExecutionError, match="an abort needs a reason"):
        execute("canary_release", params, runs_dir=tmp_path)
    assert read_canary(store, "demo") is not None  # refused before any write

    params["reason"] = "test: p99 doubled at 50%"
    record = outputs(execute("canary_release", params, runs_dir=tmp_path))
    assert "canary in progress: 2 at 50% of traffic" in record and "no worker serves a canary of demo" in record
    assert "no canary: demo@1 serves all traffic on every worker" in record
    assert read_canary(store, "demo") is None and worker_canaries(server.base_url) == {}
    assert store.history("demo")[-1]["reason"] == "canary aborted: test: p99 doubled at 50%"

    history = store.history("demo")
    again = outputs(execute("canary_release", params, runs_dir=tmp_path))  # the same command after success
    assert "no canary in progress: nothing to abort" in again and store.history("demo") == history


def test_the_canary_runbook_checks_the_server_and_token_before_it_writes(at_version_1, store, tmp_path):
    from aieng.store.canary_record import read_canary

    with_eval(store, "1")
    with_eval(store, "2")
    params = {**at_version_1, "version": "2", "steps": "50,100", "interval_s": 1}
    history = store.history("demo")
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PapermillExecutionError, match="does not answer"):
        execute("canary_release", {**params, "server_url": closed}, runs_dir=tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIENG_ADMIN_TOKEN", "")
        with pytest.raises(PapermillExecutionError, match="AIENG_ADMIN_TOKEN is unset"):
            execute("canary_release", params, runs_dir=tmp_path)
    assert store.history("demo") == history and read_canary(store, "demo") is None
