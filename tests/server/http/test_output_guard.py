"""The output guard: each check alone, then on the served app (in-process, ``inprocess``),
whole replies and streams, flag and fallback, counted in /metrics."""

import json

import pytest

from aieng.observability.scrape import parse
from aieng.server.http.output_guard import OutputGuard
from aieng.settings import Settings


def test_each_check_fires_on_its_case_and_not_on_good_answers(tmp_path):
    guard = OutputGuard(
        checks=("empty", "repetition", "json", "blocklist"),
        max_repeats=4,
        json_prompts=r"^json:",
        blocklist=("forbidden word", "secret"),
    )
    assert guard.check("add: 2+3", "5") is None
    assert guard.check("add: 2+3", "  \n").check == "empty"
    assert guard.check("x", "ok kimkimkimkimkimkimkimkimkim").check == "repetition"
    assert guard.check("x", "a heading\n----------") is None  # a short run is not a loop
    assert guard.check("x", "no " * 12).check == "repetition"
    assert guard.check("json: name=ana", '{"name": "ana"}') is None
    assert guard.check("json: name=ana", '{"name": "ana"').check == "json"
    assert guard.check("add: 2+3", '{"name": "ana"') is None  # not a json prompt
    assert guard.check("x", "the Secret is out").check == "blocklist"
    assert guard.check("x", "secretary") is None  # whole words only
    assert guard.check("x", "", constrained=True) is None  # a constrained answer's format is the grammar's
    assert guard.check("x", "a SECRET", constrained=True).check == "blocklist"


def test_the_hook_and_the_settings(tmp_path, monkeypatch):
    (tmp_path / "my_guard.py").write_text(
        "def refuse(prompt, text):\n    return 'too short' if len(text) < 3 else None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    blocklist = tmp_path / "blocked.txt"
    blocklist.write_text("apple\n\n")
    guard = OutputGuard.from_settings(
        Settings(
            guard_checks="hook,blocklist",
            guard_hook="my_guard:refuse",
            guard_blocklist=str(blocklist),
            guard_action="fallback",
        )
    )
    assert guard.check("x", "ab").reason == "too short" and guard.check("x", "an apple pie").check == "blocklist"
    assert guard.check("x", "a pear") is None and guard.action == "fallback"
    assert OutputGuard.from_settings(Settings(guard_checks="")) is None
    for bad in (
        dict(guard_checks="json"),
        dict(guard_checks="blocklist"),
        dict(guard_checks="hook"),
        dict(guard_checks="spelling"),
        dict(guard_action="retry"),
    ):
        with pytest.raises(ValueError, match="output guard"):
            OutputGuard.from_settings(Settings(**bad))


@pytest.fixture(scope="module")
def guarded(inprocess, session_store, tmp_path_factory):
    blocklist = tmp_path_factory.mktemp("guard") / "blocked.txt"
    blocklist.write_text("river\n")
    return inprocess(
        session_store.root,
        guard_checks="empty,repetition,json,blocklist",
        guard_action="fallback",
        guard_json_prompts="json:",
        guard_blocklist=str(blocklist),
        guard_fallback="Sorry, no reliable answer.",
    )


def chat(client, content, **extra):
    return client.post(
        "/v1/chat/completions",
        json={
            "model": "demo",
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": 40,
            **extra,
        },
    )


def test_fallback_replaces_a_caught_answer_and_marks_it(guarded):
    good = chat(guarded, "add: 27+58")
    assert good.json()["choices"][0]["message"]["content"] == "85" and "x-output-guard" not in good.headers
    assert "guard" not in good.json()["choices"][0]
    blocked = chat(guarded, "reverse: apple stone river")  # the answer "river stone apple" holds a blocked word
    choice = blocked.json()["choices"][0]
    assert blocked.headers["x-output-guard"] == "blocklist; action=fallback"
    assert choice["message"]["content"] == "Sorry, no reliable answer." and choice["finish_reason"] == "content_filter"
    assert choice["guard"]["check"] == "blocklist" and "river" in choice["guard"]["reason"]
    cut = chat(guarded, "json: name=ana age=31", max_tokens=5)  # cut mid-object by max_tokens: not JSON
    assert cut.json()["choices"][0]["guard"]["check"] == "json"
    constrained = chat(guarded, "json: name=ana age=31", max_tokens=5, response_format={"type": "json_object"})
    assert "guard" not in constrained.json()["choices"][0]  # its format is the grammar's business


def stream_chunks(client, content, max_tokens):
    """The parsed ``data:`` chunks of a greedy streamed chat reply."""
    body = {"model": "demo", "messages": [{"role": "user", "content": content}], "temperature": 0}
    with client.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": max_tokens, "stream": True}) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_a_stream_is_cut_before_a_blocked_chunk_leaves(guarded):
    chunks = stream_chunks(guarded, "reverse: apple stone river", max_tokens=20)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "river" not in text
    assert chunks[-1]["choices"][0]["finish_reason"] == "content_filter"
    assert chunks[-1]["choices"][0]["guard"]["check"] == "blocklist"
    last = stream_chunks(guarded, "json: name=ana age=31", max_tokens=5)[-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["guard"] == {**last["guard"], "check": "json", "action": "flag"}


def test_caught_answers_are_counted_by_check_and_action(guarded):
    snapshot = parse(guarded.get("/metrics").text)
    counted = lambda check, action: snapshot.value("aieng_output_guard_total", check=check, action=action)  # noqa: E731
    assert counted("blocklist", "fallback") >= 2 and counted("json", "fallback") >= 1
    assert counted("json", "flag") >= 1
