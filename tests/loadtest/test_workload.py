"""Workload files: the built-in ones load, every mistake is named, prompts follow the classes."""

import pytest

from aieng.loadtest.workload import WorkloadError, load_workload, parse_workload

MINIMAL = {"classes": [{"name": "a", "share": 1.0, "max_tokens": 8, "family": ["add"]}]}


def test_the_built_in_workloads_are_the_articles_mix():
    default = load_workload("default")
    assert [(c.name, c.share) for c in default.classes] == [("short", 0.2), ("medium", 0.5), ("long", 0.3)]
    assert default.model == "demo" and default.arrival.process == "poisson"
    big = load_workload("big")
    assert big.model == "big" and all(c.exact_tokens for c in big.classes)
    assert len(big.classes[2].prompts(1, 0)[0].split()) == 801  # the task word and 800 words


def test_a_toml_file_reads_like_yaml(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(
        'name = "mine"\nduration_s = 10\n[arrival]\nprocess = "closed"\nusers = 3\n'
        '[[classes]]\nname = "only"\nshare = 1.0\nmax_tokens = 4\ntext = "hello"\n'
    )
    workload = load_workload(str(path))
    assert (
        workload.name == "mine" and workload.arrival.users == 3 and workload.classes[0].prompts(2, 0) == ["hello"] * 2
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"classes": []}, "non-empty list"),
        ({"classes": [{"name": "a", "share": 0.5, "max_tokens": 8, "family": ["add"]}]}, "add up to 1"),
        ({"classes": [{"name": "a", "share": 1.0, "max_tokens": 8}]}, "exactly one prompt source"),
        ({"classes": [{"name": "a", "share": 1.0, "max_tokens": 8, "family": ["poetry"]}]}, "not demo task families"),
        ({"classes": [{"name": "a", "share": 1.0, "max_tokens": 0, "text": "x"}]}, "max_tokens must be >= 1"),
        ({"classes": [{"name": "a", "share": 1.0, "max_tokens": 2.5, "text": "x"}]}, "must be an integer"),
        ({"arrival": {"process": "tidal"}}, "arrival.process must be one of"),
        ({"arrival": {"rate": 0}}, "needs rate > 0"),
        ({"route": "/v1/embeddings"}, "`route` must be one of"),
        ({"colour": "blue"}, "unknown field"),
        ({"duration_s": 5, "warmup_s": 5}, "nothing would be measured"),
        ({"sweep": {"factor": 1}}, "factor > 1"),
    ],
)
def test_each_mistake_in_a_workload_is_named(change, message):
    with pytest.raises(WorkloadError, match=message):
        parse_workload({**MINIMAL, **change})


def test_missing_and_unparsable_files_say_what_to_do(tmp_path):
    with pytest.raises(WorkloadError, match="built in: .*'default'"):
        load_workload("nosuch")
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(str(tmp_path / "absent.yaml"))
    (tmp_path / "bad.yaml").write_text("classes: [unclosed")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(str(tmp_path / "bad.yaml"))
