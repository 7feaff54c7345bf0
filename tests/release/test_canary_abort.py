"""``aieng release canary NAME --abort``: all traffic back to stable, with a reason in history;
a second abort changes nothing; wrong uses are one-line errors that change nothing."""

import pytest

from aieng.store.canary_record import read_canary, set_canary

from ..command import aieng


@pytest.fixture
def store(tiny_two_versions):
    store = tiny_two_versions
    set_canary(store, "demo", "2", 0.1, reason="test: step 1")
    return store


def test_abort_clears_the_canary_with_its_reason_and_a_second_abort_does_nothing(store):
    done = aieng("release", "canary", "demo", "--abort", "--reason", "alert fired", store=store.root)
    assert done.returncode == 0, done.stderr
    assert "canary 2 cleared" in done.stdout and read_canary(store, "demo") is None
    event = store.history("demo")[-1]
    assert event["action"] == "canary_cleared" and event["reason"] == "canary aborted: alert fired"
    assert store.current("demo") == "1"

    again = aieng("release", "canary", "demo", "--abort", "--reason", "alert fired", store=store.root)
    assert again.returncode == 0 and "nothing to abort" in again.stdout
    assert store.history("demo")[-1] == event


@pytest.mark.parametrize(
    "args, message",
    [
        (["--abort"], "needs a reason (--reason WHY)"),
        (["2", "--abort", "--reason", "x"], "takes no version"),
        ([], "give the version and the server"),
        (["2"], "give the version and the server"),
    ],
)
def test_a_wrong_use_is_a_one_line_error_and_the_canary_stays(store, args, message):
    result = aieng("release", "canary", "demo", *args, store=store.root)
    assert result.returncode == 1 and result.stderr.startswith("aieng: error: ") and message in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert read_canary(store, "demo").version == "2"
