"""Suite files: the schema and meaning checks refuse bad suites with the place, every assertion
kind judges as documented, the hash follows content not layout, the demo's file is generated."""

import json

import pytest
import yaml

from aieng.demo.heldout_suite import SUITE_FILE, render
from aieng.errors import SuiteError
from aieng.evaluation.assertions import failures
from aieng.evaluation.suite_file import Case, load_suite


def _write(tmp_path, document, name="suite.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document) if name.endswith(".yaml") else json.dumps(document))
    return path


def _suite(**changes):
    base = {
        "format": "aieng-suite/1",
        "name": "mine",
        "version": 1,
        "cases": [{"id": "a", "family": "f", "prompt": "hi", "expect": [{"not_empty": True}]}],
    }
    return {**base, **changes}


def test_the_committed_demo_suite_is_what_its_module_generates():
    assert SUITE_FILE.read_text() == render(), "run `python -m aieng.demo.heldout_suite` and commit the file"


def test_a_suite_reads_from_yaml_or_json_and_hashes_its_content(tmp_path):
    yaml_suite = load_suite(_write(tmp_path, _suite()))
    json_suite = load_suite(_write(tmp_path, _suite(), "suite.json"))
    assert yaml_suite.sha256 == json_suite.sha256 and yaml_suite.label == "mine-v1"
    assert load_suite(_write(tmp_path, _suite(version=2), "other.yaml")).sha256 != yaml_suite.sha256
    case = yaml_suite.cases[0]
    assert case.sampling == {"max_tokens": 64, "temperature": 0.0} and case.weight == 1.0 and case.use == "both"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (_suite(format="aieng-suite/9"), "at /format: 'aieng-suite/1' was expected"),
        (_suite(cases=[]), "at /cases: [] should be non-empty"),
        (_suite(cases=[{"id": "a", "family": "f"}]), "at /cases/0"),  # neither prompt nor messages
        (_suite(cases=[{"id": "a", "family": "f", "prompt": "x", "expect": [{"exactly": "y"}]}]), "/cases/0/expect/0"),
        (_suite(cases=[{"id": "a", "family": "f", "prompt": "x", "weight": 0}]), "at /cases/0/weight"),
        (_suite(surprise=1), "Additional properties are not allowed ('surprise'"),
        (_suite(cases=[{"id": "a", "family": "f", "prompt": "x"}] * 2), "case id 'a' appears twice"),
        (_suite(cases=[{"id": "a", "family": "f", "prompt": "x", "expect": [{"regex": "("}]}]), "does not compile"),
        (
            _suite(cases=[{"id": "a", "family": "f", "prompt": "x", "expect": [{"custom": "no_such_mod:f"}]}]),
            "cannot be loaded",
        ),
        (_suite(thresholds={"floors": {"other": 0.5}}), "names family 'other', which has no gate case"),
        (_suite(perplexity={"text": "missing.txt"}), "which is not a file"),
        (_suite(perplexity={"references": True}), "no case has a reference answer"),
    ],
)
def test_a_bad_suite_is_refused_saying_where(tmp_path, document, message):
    with pytest.raises(SuiteError) as caught:
        load_suite(_write(tmp_path, document))
    assert message in str(caught.value) and caught.value.code == "suite_invalid"


def test_unreadable_or_unparsable_files_are_refused(tmp_path):
    with pytest.raises(SuiteError, match="cannot read the eval suite"):
        load_suite(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("cases: [unclosed")
    with pytest.raises(SuiteError, match="is not valid YAML"):
        load_suite(tmp_path / "bad.yaml")


def _case(*expect):
    return Case("c", "f", None, "q", {}, tuple(expect))


def custom_check(answer, case):  # used by the custom assertion below, as module:function
    return True if answer.startswith("ok") else f"{case.id} says no"


def test_every_assertion_kind_judges_as_documented():
    assert failures(_case({"exact": "a b"}), "a b") == []
    assert failures(_case({"exact": "a b"}), "a  b") == ["exact: expected 'a b', got 'a  b'"]
    assert failures(_case({"contains": "cat"}), "a cat") == [] and failures(_case({"contains": "dog"}), "cat")
    assert failures(_case({"regex": r"^\d+$"}), "42") == [] and failures(_case({"regex": r"^\d+$"}), "4x")
    schema = {"type": "object", "required": ["a"]}
    assert failures(_case({"json_schema": schema}), '{"a": 1}') == []
    assert failures(_case({"json_schema": schema}), "{}") == ["json_schema: 'a' is a required property"]
    assert failures(_case({"json_schema": schema}), "nope")[0].startswith("json_schema: not JSON")
    assert failures(_case({"one_of": ["yes", "no"]}), "no") == [] and failures(_case({"one_of": ["yes"]}), "maybe")
    assert failures(_case({"max_length": 3}), "abc") == [] and failures(_case({"max_length": 3}), "abcd")
    assert failures(_case({"not_empty": True}), "") == ["not_empty: the answer is empty"]
    hook = f"{__name__}:custom_check"
    assert failures(_case({"custom": hook}), "ok then") == []
    assert failures(_case({"custom": hook}), "nope") == [f"custom {hook}: c says no"]
    both = failures(_case({"contains": "x"}, {"max_length": 1}), "yy")
    assert len(both) == 2  # every broken assertion is reported, not the first
    assert "你好" in failures(_case({"exact": "再见"}), "你好")[0]  # not only ASCII


def test_a_custom_assertion_that_raises_fails_the_case_not_the_run(tmp_path, monkeypatch):
    (tmp_path / "hooks.py").write_text("def boom(answer, case):\n    raise RuntimeError('bad hook')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert failures(_case({"custom": "hooks:boom"}), "x") == ["custom hooks:boom: raised RuntimeError: bad hook"]
