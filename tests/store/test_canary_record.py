"""The canary record in the store: set, read, cleared, refused when it would mean nothing."""

import pytest

from aieng.errors import AiengError, ModelNotFoundError
from aieng.store.canary_record import canary_path, clear_canary, read_canary, set_canary


@pytest.fixture
def store(tiny_two_versions):
    return tiny_two_versions


def test_a_canary_is_recorded_read_back_and_cleared_with_history(store):
    assert read_canary(store, "demo") is None and clear_canary(store, "demo") is None
    set_canary(store, "demo", "2", 0.1, reason="step 1")
    record = read_canary(store, "demo")
    assert (record.version, record.weight) == ("2", 0.1)
    set_canary(store, "demo", "2", 0.5, reason="step 2")
    assert read_canary(store, "demo").weight == 0.5
    assert clear_canary(store, "demo", reason="done")["from"] == "2"
    assert read_canary(store, "demo") is None and not canary_path(store, "demo").exists()
    actions = [(e["action"], e.get("weight")) for e in store.history("demo")[-3:]]
    assert actions == [("canary_set", 0.1), ("canary_set", 0.5), ("canary_cleared", None)]


def test_model_history_shows_the_canary_steps(store, capsys):
    from aieng.cli.main import main

    set_canary(store, "demo", "2", 0.1, reason="step 1")
    clear_canary(store, "demo", reason="rolled back")
    assert main(["model", "history", "demo", "--store", str(store.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "canary_set" in lines[-2] and "1 -> 2" in lines[-2] and "[10% of traffic]" in lines[-2]
    assert "canary_cleared" in lines[-1] and "2 -> 1" in lines[-1] and "rolled back" in lines[-1]


def test_a_canary_of_the_current_version_reads_as_none_once_it_is_promoted(store):
    set_canary(store, "demo", "2", 1.0)
    store.promote("demo", "2")
    assert read_canary(store, "demo") is None


@pytest.mark.parametrize(
    "version, weight, error",
    [("2", 1.5, AiengError), ("2", -0.1, AiengError), ("1", 0.1, AiengError), ("9", 0.1, ModelNotFoundError)],
)
def test_bad_canaries_are_refused_and_write_nothing(store, version, weight, error):
    before = store.history("demo")
    with pytest.raises(error):
        set_canary(store, "demo", version, weight)
    assert not canary_path(store, "demo").exists() and store.history("demo") == before
