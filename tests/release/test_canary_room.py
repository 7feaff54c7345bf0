"""A canary the server's GPUs have no room for is refused before anything is written; one a
worker failed to load stops the release at once with the worker's reason. The server's answers
(``GET /admin/status`` on a GPU host) are faked: this host has no GPU to report room on."""

import pytest

from aieng.evaluation.gate import GateDecision
from aieng.release import canary_rollout, canary_room
from aieng.store import ModelRef
from aieng.store.canary_record import read_canary


@pytest.fixture
def store(tiny_two_versions):
    return tiny_two_versions


def room(weight_bytes, kv_rows, element_bytes=2):
    return {"canary_room": {"weight_bytes": weight_bytes, "kv_rows": kv_rows, "element_bytes": element_bytes}}


def test_room_is_judged_on_the_canarys_weights_and_the_kept_kv_rows(store, monkeypatch):
    params = store.manifest(ModelRef("demo", "2")).num_parameters
    for status, refused in [
        (room(params * 2, 4), None),  # fits exactly
        ({"canary_room": None}, None),  # a CPU host: the load's own memory check applies
        (None, None),  # no answer: the reload that follows says what is wrong
        (room(params * 2 - 1, 4), "its weights need"),
        (room(params * 2, 0), "holds no KV row"),
    ]:
        monkeypatch.setattr(canary_room, "_status", lambda url, token, status=status: status)
        reason = canary_room.room_refusal(store, "demo", "2", "http://server", "token")
        assert (reason is None) if refused is None else (refused in reason), (status, reason)


def test_a_canary_without_room_is_refused_before_anything_is_written(store, monkeypatch):
    monkeypatch.setattr(canary_room, "_status", lambda url, token: room(1, 4))
    monkeypatch.setattr(canary_rollout, "judge", lambda *args: GateDecision(True))  # the gate passes
    before = store.history("demo")
    logs: list[str] = []
    result = canary_rollout.run_canary(store, "demo", "2", "http://server", steps=[10], interval_s=1, log=logs.append)
    assert (result.outcome, result.rule) == ("refused", "memory") and "its weights need" in result.reason
    assert "refused by the GPU memory check" in logs[-1]
    assert read_canary(store, "demo") is None and store.current("demo") == "1"  # no record, nothing moved
    assert store.history("demo")[:-1] == before and store.history("demo")[-1]["action"] == "canary_refused"


def test_a_worker_that_failed_to_load_the_canary_is_read_at_once(monkeypatch):
    failed = {"canary_failed": {"version": "2", "reason": "no room for canary demo@2 on cuda:0"}}
    monkeypatch.setattr(canary_room, "_status", lambda url, token: failed)
    assert canary_room.load_failure("http://server", "t", "2") == "no room for canary demo@2 on cuda:0"
    assert canary_room.load_failure("http://server", "t", "3") is None  # an older failure is not this one
