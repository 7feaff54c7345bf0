"""Constrained decoding in the engine: outputs match their grammar by construction, free rows in
the same batch are untouched, bad grammars are InvalidRequestErrors, a random-schema fuzz."""

import json
import random

import jsonschema
import pytest
import torch

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.constraints import Constraint, ConstraintCompiler, mask_logits
from aieng.errors import InvalidRequestError

EAGER = EngineConfig(compile=False)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(demo):
    model, tokenizer = demo
    return Engine(model, tokenizer, config=EAGER)


def test_mask_leaves_free_rows_alone_and_allows_only_the_grammar(engine):
    matcher = engine.constraints.matcher(Constraint("regex", "[0-9]+"))
    logits = torch.randn(2, engine.model.config.vocab_size)
    masked = mask_logits(logits, [None, matcher])
    assert torch.equal(masked[0], logits[0])
    allowed = torch.isfinite(masked[1]).nonzero().flatten().tolist()
    texts = {engine.tokenizer.decode([i]) for i in allowed}
    assert allowed and all(t.isdigit() for t in texts), texts
    assert mask_logits(logits, [None, None]) is logits  # nothing constrained: no copy


def test_constrained_and_free_rows_share_a_batch(engine, render):
    prompts = [render("json: name=ana age=31"), render("add: 27+58"), render("add: 27+58"), render("sort: river apple")]
    free = engine.generate(prompts, SamplingParams(max_tokens=40, temperature=0))
    params = [
        SamplingParams(max_tokens=40, temperature=0, constraint=Constraint.json_schema(PERSON)),
        SamplingParams(max_tokens=40, temperature=0),
        SamplingParams(max_tokens=40, temperature=0, constraint=Constraint("regex", "[0-9]{3}")),
        SamplingParams(max_tokens=40, temperature=0, constraint=Constraint.choice(["apple river", "river apple"])),
    ]
    out = engine.generate(prompts, params)
    assert out[0].text == '{"name": "ana", "age": 31}' == free[0].text  # the model's own answer fits the schema
    assert out[1].text == free[1].text == "85"  # the free row is untouched by its constrained batch-mates
    assert len(out[2].text) == 3 and out[2].text.isdigit() and out[2].finish_reason == "stop"
    assert out[3].text in ("apple river", "river apple") and out[3].finish_reason == "stop"


def test_a_completed_grammar_finishes_the_row_without_an_eos_step(engine, render):
    out = engine.generate(
        [render("add: 27+58")],
        SamplingParams(max_tokens=10, temperature=0, constraint=Constraint.choice(["yes", "no"])),
    )[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"
    assert engine.eos_ids.isdisjoint(out.token_ids)


def test_sampled_rows_stay_inside_the_grammar(engine, render):
    schema = {
        "type": "object",
        "properties": {"pet": {"enum": ["cat", "dog"]}, "n": {"type": "integer"}},
        "required": ["pet", "n"],
        "additionalProperties": False,
    }
    params = [
        SamplingParams(max_tokens=60, temperature=1.5, seed=s, constraint=Constraint.json_schema(schema))
        for s in range(6)
    ]
    for result in engine.generate([render("json: pet=cat score=4")] * 6, params):
        if result.finish_reason == "stop":
            jsonschema.validate(json.loads(result.text), schema)
        else:  # cut by max_tokens mid-value: still a prefix of something valid, never off-grammar
            assert result.text.startswith("{")


@pytest.mark.parametrize(
    "constraint,fragment",
    [
        (Constraint.json_schema({"type": "object", "properties": {"a": {"type": "strng"}}}), "strng"),
        (Constraint("regex", "([a-z"), "regex"),
        (Constraint("json_schema", "{not json", "guided_json"), "JSON"),
    ],
)
def test_an_invalid_grammar_is_a_precise_invalid_request(engine, constraint, fragment):
    with pytest.raises(InvalidRequestError) as info:
        engine.constraints.matcher(constraint)
    assert fragment in info.value.message and info.value.param == constraint.param


def test_choices_must_be_non_empty_strings():
    for bad in ([], [""], ["a", 3]):
        with pytest.raises(InvalidRequestError):
            Constraint.choice(bad)


def test_grammars_are_compiled_once_and_copied_per_request(demo):
    _, tokenizer = demo
    compiler = ConstraintCompiler(tokenizer, vocab_size=len(tokenizer), eos_id=tokenizer.eos_token_id)
    first, second = compiler.matcher(Constraint.json_schema(PERSON)), compiler.matcher(Constraint.json_schema(PERSON))
    assert first is not second and compiler._template.cache_info().currsize == 1
    ids = tokenizer.encode('{"name": "x"', add_special_tokens=False)
    assert first.consume_tokens(ids) and not second.is_error()  # copies do not share state
    assert second.validate_tokens(ids) == len(ids)


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A random valid JSON schema over the kinds the demo model can be forced through."""
    kinds = ["string", "integer", "boolean", "enum", "array"] + (["object"] * 2 if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 6)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["cat", "dog", "red", "ana", 7, True, None], rng.randint(1, 3))}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": 1, "maxItems": rng.randint(1, 3)}
    keys = rng.sample(["name", "age", "city", "pet", "score", "tags"], rng.randint(1, 3))
    return {
        "type": "object",
        "properties": {k: random_schema(rng, depth + 1) for k in keys},
        "required": keys,
        "additionalProperties": False,
    }


def test_fuzz_random_schemas_give_outputs_that_parse_and_validate(engine, render):
    """40 random schemas, greedy and sampled, batched together: every output that finished parses and
    validates against its schema; one that ran out of tokens is the only excuse."""
    rng = random.Random(13)
    schemas = [random_schema(rng) for _ in range(40)]
    prompts = [render(rng.choice(["json: name=ana age=31", "add: 27+58", "reverse: apple stone"])) for _ in schemas]
    params = [
        SamplingParams(
            max_tokens=120, temperature=rng.choice([0, 0.7, 1.5]), seed=i, constraint=Constraint.json_schema(schema)
        )
        for i, schema in enumerate(schemas)
    ]
    results = engine.generate(prompts, params)
    finished = 0
    for schema, result in zip(schemas, results):
        if result.finish_reason == "length":
            continue
        finished += 1
        jsonschema.validate(json.loads(result.text), schema)
    assert finished >= 30, f"only {finished} of 40 finished within 120 tokens"
