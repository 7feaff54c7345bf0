"""Captured requests become suite cases to label: one per distinct question, with where each came
from, no assertions; the file reads back as a valid suite and serves the comparison as prompts."""

import json

import pytest

from aieng.errors import SuiteError
from aieng.evaluation.compare import prompt_file_cases
from aieng.evaluation.from_capture import write_suite_from_capture
from aieng.evaluation.suite_file import load_suite
from aieng.loadtest.replay import ReplayError


def _record(**fields):
    """A capture record as ``aieng.server.http.capture`` writes one."""
    base = {"captured_at": "2026-12-03T10:00:00+00:00", "t": 0.5, "request_id": "abc", "reason": "guard"}
    route = "/v1/chat/completions" if "messages" in fields else "/v1/completions"
    return json.dumps({**base, "endpoint": route, "model": "mine", "status": 200, **fields}, ensure_ascii=False)


def test_captured_requests_become_unlabelled_cases_with_their_source(tmp_path):
    chat = [{"role": "user", "content": "你好，退货要多久？"}]
    lines = [
        _record(messages=chat, sampling={"max_tokens": 32, "temperature": 0.7, "stop": "\n"}, output="三十天"),
        _record(messages=chat, request_id="again"),  # the same question again: one case
        _record(prompt="Once upon a time", reason="error", status=500, error="engine failed", output=None),
        _record(prompt=["Once upon a time", "Long ago"]),  # several prompts in one request: a case each
    ]
    (tmp_path / "capture-1.jsonl").write_text("\n".join(lines) + "\n")
    out = write_suite_from_capture([tmp_path], tmp_path / "cases.yaml")
    suite = load_suite(out)
    assert [c.id for c in suite.cases] == ["captured-0001", "captured-0002", "captured-0003"] and not suite.labelled
    first, second, third = suite.cases
    assert third.prompt == "Long ago"
    assert first.family == "guard" and first.messages == tuple(chat) and first.sampling["stop"] == ["\n"]
    assert first.sampling["temperature"] == 0.7 and second.prompt == "Once upon a time" and second.family == "error"
    source = suite.document["cases"][0]["source"]
    assert source["output"] == "三十天" and source["request_id"] == "abc"
    assert suite.document["cases"][1]["source"]["error"] == "engine failed"
    as_prompts = prompt_file_cases(tmp_path / "capture-1.jsonl")  # a capture file is a prompt file too
    assert [c.id for c in as_prompts] == ["line-1", "line-2", "line-3", "line-4.1", "line-4.2"]


def test_bad_captures_and_an_existing_output_are_refused_without_writing(tmp_path):
    (tmp_path / "bad.jsonl").write_text(_record(messages=[]) + "\n")
    with pytest.raises(ReplayError, match=r"bad.jsonl:1: a chat record needs its `messages`"):
        write_suite_from_capture([tmp_path / "bad.jsonl"], tmp_path / "out.yaml")
    (tmp_path / "junk.jsonl").write_text("not json\n")
    with pytest.raises(ReplayError, match=r"junk.jsonl:1: not a JSON line"):
        write_suite_from_capture([tmp_path / "junk.jsonl"], tmp_path / "out.yaml")
    assert not (tmp_path / "out.yaml").exists() and not list(tmp_path.glob(".out.yaml.tmp-*"))
    (tmp_path / "labelled.yaml").write_text("kept")
    (tmp_path / "ok.jsonl").write_text(_record(prompt="hi") + "\n")
    with pytest.raises(SuiteError, match="exists"):
        write_suite_from_capture([tmp_path / "ok.jsonl"], tmp_path / "labelled.yaml")
    assert (tmp_path / "labelled.yaml").read_text() == "kept"
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(ReplayError, match="holds no capture files"):
        write_suite_from_capture([tmp_path / "empty-dir"], tmp_path / "x.yaml")
