"""Served answers kept with a version: keyed by the request, merged, read back in the order asked,
and the agreement the watchdog judges a suite without assertions by."""

from dataclasses import replace

import pytest

from aieng.evaluation.answers import Answer
from aieng.evaluation.suite_file import Case
from aieng.release.probe import ProbeResult
from aieng.release.served_answers import MAX_KEPT, agreement_with_recorded, record, recorded, request_key
from aieng.store import ModelRef, ModelStore


def case(i: int, **sampling) -> Case:
    return Case(
        id=f"q{i}",
        family="chat",
        messages=({"role": "user", "content": f"question {i}"},),
        prompt=None,
        sampling={"max_tokens": 16, "temperature": 0.0, **sampling},
    )


def probe(cases, texts) -> ProbeResult:
    return ProbeResult(list(cases), [Answer(t, len(t.split())) for t in texts], None)


@pytest.fixture()
def store(tmp_path, tiny_demo_dir):
    store = ModelStore(tmp_path / "store")
    for version in ("1", "2"):
        store.register(tiny_demo_dir, "tiny", version)
    return store


def test_the_key_is_the_request_not_the_case_id():
    assert request_key(case(1)) == request_key(replace(case(1), id="renamed", family="other"))
    assert request_key(case(1)) != request_key(case(2))
    assert request_key(case(1)) != request_key(case(1, max_tokens=32))  # another request, another answer


def test_answers_are_merged_and_read_back_in_the_order_asked(store):
    cases = [case(i) for i in range(4)]
    record(store, "tiny", "1", probe(cases[:3], ["a", "b", "c"]), by="test", url="http://x")
    kept = record(store, "tiny", "1", probe(cases[2:], ["C", "d"]), by="test", url="http://x")
    assert kept == 4
    answers, missing = recorded(store, "tiny", "1", list(reversed(cases)))
    assert missing == 0 and [a.text for a in answers] == ["d", "C", "b", "a"]  # the newest answer wins
    saved = store.manifest(ModelRef("tiny", "1")).served_answers
    assert saved["by"] == "test" and saved["url"] == "http://x" and saved["recorded_at"]
    assert store.verify(ModelRef("tiny", "1")).ok  # a mutable field: the hashes still hold
    assert recorded(store, "tiny", "2", cases) == (None, 4)  # nothing kept for another version


def test_only_the_newest_answers_are_kept(store, monkeypatch):
    monkeypatch.setattr("aieng.release.served_answers.MAX_KEPT", 3)
    cases = [case(i) for i in range(5)]
    record(store, "tiny", "1", probe(cases, list("abcde")), by="test", url="u")
    assert recorded(store, "tiny", "1", cases[2:])[1] == 0 and recorded(store, "tiny", "1", cases[:2]) == (None, 2)
    assert MAX_KEPT >= 100  # a probe sample is tens of cases: several suites fit


def test_agreement_with_the_replaced_versions_served_answers(store):
    cases = [case(i) for i in range(5)]
    record(store, "tiny", "1", probe(cases, ["one", "two", "three", "four", "five"]), by="test", url="u")
    same = probe(cases, ["one", "two", "three", "four", "five"])
    seen, failures = agreement_with_recorded(store, "tiny", "1", same, 0.8)
    assert failures == [] and "100% of 5 answers agree with tiny@1" in seen
    one_moved = probe(cases, ["one", "two", "three", "four", "5"])
    assert agreement_with_recorded(store, "tiny", "1", one_moved, 0.8)[1] == []  # 80% is enough
    moved = probe(cases, ["one", "2", "3", "four", "5"])
    seen, failures = agreement_with_recorded(store, "tiny", "1", moved, 0.8)
    assert failures and "40% < 80%" in failures[0] and "q1, q2, q4" in failures[0]


def test_no_answers_on_record_judges_nothing_and_says_how_to_record_them(store):
    cases = [case(i) for i in range(3)]
    record(store, "tiny", "1", probe(cases[:1], ["one"]), by="test", url="u")
    seen, failures = agreement_with_recorded(store, "tiny", "1", probe(cases, ["x", "y", "z"]), 0.8)
    assert failures is None
    assert "2 of 3 probe requests have no answer of tiny@1" in seen and "aieng release record-answers tiny" in seen
