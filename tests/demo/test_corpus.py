"""The demo corpus: deterministic, checkable, and never training on a held-out prompt."""

import json
from collections import Counter

import pytest

from aieng.demo.corpus import (
    FAMILIES,
    HELD_OUT_PER_MILLE,
    SYSTEM_PROMPTS,
    Example,
    held_out_examples,
    is_held_out,
    training_examples,
)


def test_training_examples_are_deterministic_in_the_seed():
    assert training_examples(5, 400) == training_examples(5, 400)
    assert training_examples(5, 400) != training_examples(6, 400)


def test_held_out_examples_are_deterministic_distinct_and_grouped_by_family():
    examples = held_out_examples(1234, 20)
    assert examples == held_out_examples(1234, 20)
    assert examples != held_out_examples(1, 20)
    assert [e.family for e in examples] == [f for f in FAMILIES for _ in range(20)]
    assert len({e.prompt for e in examples}) == len(examples)


def test_training_never_contains_a_held_out_prompt():
    train = training_examples(0, 20000)
    held = held_out_examples(1234, 100)
    assert not any(is_held_out(e.prompt) for e in train)
    assert all(is_held_out(e.prompt) for e in held)
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    # Another training seed avoids the same prompts: the split does not depend on any seed.
    assert not {e.prompt for e in training_examples(99, 5000)} & {e.prompt for e in held}


def test_is_held_out_is_a_stable_hash_split_of_about_the_configured_share():
    prompts = [f"add: {a}+{b}" for a in range(10, 100) for b in range(10, 100)]
    share = sum(map(is_held_out, prompts)) / len(prompts)
    assert abs(share - HELD_OUT_PER_MILLE / 1000) < 0.02
    assert [is_held_out(p) for p in prompts[:50]] == [is_held_out(p) for p in prompts[:50]]


def test_every_family_is_trained_and_answers_are_correct():
    train = training_examples(3, 4000)
    assert set(Counter(e.family for e in train)) == set(FAMILIES)
    for e in train + held_out_examples(3, 30):
        task, _, body = e.prompt.partition(": ")
        assert task == e.family
        if e.family == "reverse":
            assert e.answer.split() == body.split()[::-1]
        elif e.family == "sort":
            assert e.answer.split() == sorted(body.split())
        elif e.family == "add":
            a, b = body.split("+")
            assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
            assert e.answer == str(int(a) + int(b))
        elif e.family == "json":
            pairs = dict(item.split("=") for item in body.split())
            parsed = json.loads(e.answer)
            assert list(parsed) == list(pairs)  # key order kept
            assert {k: str(v) for k, v in parsed.items()} == pairs
        else:  # pragma: no cover
            pytest.fail(f"unknown family {e.family}")


def test_some_training_examples_carry_a_system_message_held_out_ones_do_not():
    train = training_examples(0, 4000)
    with_system = [e for e in train if e.system is not None]
    assert 0.02 < len(with_system) / len(train) < 0.1
    assert {e.system for e in with_system} <= set(SYSTEM_PROMPTS)
    assert all(e.system is None for e in held_out_examples(0, 10))


def test_mix_selects_families_and_rejects_unknown_ones():
    only_add = training_examples(0, 200, mix={"add": 1.0})
    assert {e.family for e in only_add} == {"add"}
    with pytest.raises(ValueError, match="unknown task families"):
        training_examples(0, 10, mix={"poetry": 1.0})


def test_example_is_an_immutable_value():
    e = Example("add", "add: 10+10", "20")
    with pytest.raises(AttributeError):
        e.answer = "21"  # type: ignore[misc]
