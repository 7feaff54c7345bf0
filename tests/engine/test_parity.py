"""Greedy output of the hand-written loop is token-identical to transformers' generate()."""

import pytest

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.parity import parity_report
from aieng.engine.reference import reference_greedy

EAGER = EngineConfig.exact(compile=False)  # parity is checked in fp32; the compiled path has its own tests

PROMPTS = ["reverse: apple stone river", "add: 27+58", "json: name=ana age=31 city=oslo", "sort: river apple stone"]


@pytest.mark.parametrize("arch", ["demo", "qwen"])
def test_single_prompt_matches_generate(arch, request, render):
    model, tokenizer = request.getfixturevalue(arch)
    prompt = render(PROMPTS[0])
    engine = Engine(model, tokenizer, config=EAGER)
    got = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0))[0]
    assert (
        got.token_ids
        == reference_greedy(
            model, [engine.encode(prompt)], max_new_tokens=24, eos_ids=engine.eos_ids, pad_id=engine.pad_id
        )[0]
    )


@pytest.mark.parametrize("arch", ["demo", "qwen"])
def test_batch_of_different_lengths_matches_generate(arch, request, render):
    model, tokenizer = request.getfixturevalue(arch)
    prompts = [render(p) for p in PROMPTS] + [render("reverse: " + " ".join(["stone"] * 12))]
    report = parity_report(model, tokenizer, prompts, max_new_tokens=24)
    assert report.ok, report.mismatches
    assert report.identical == len(prompts)


def test_rows_joining_a_running_batch_get_the_same_tokens_as_alone(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    alone = {
        p: engine.generate([render(p)], SamplingParams(max_tokens=20, temperature=0))[0].token_ids for p in PROMPTS
    }

    from aieng.engine import GenerationRequest

    requests = [
        GenerationRequest(p, engine.encode(render(p)), SamplingParams(max_tokens=20, temperature=0)) for p in PROMPTS
    ]
    produced = {p: [] for p in PROMPTS}
    pending = list(requests)
    step = 0
    while pending or engine.num_running:
        joiners = [pending.pop(0)] if pending and step % 2 == 0 else []  # a new row every other step
        for event in engine.step(joiners).events:
            produced[event.request_id].append(event.token_id)
        step += 1
    assert {p: tuple(ids) for p, ids in produced.items()} == alone
    assert engine.num_running == 0 and engine.runner.decoding_ids() == []


def test_demo_model_answers_correctly_through_the_engine(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    result = engine.generate([render("reverse: apple stone river")], SamplingParams(max_tokens=16, temperature=0))[0]
    assert result.text == "river stone apple" and result.finish_reason == "stop"
    assert result.prompt_tokens == len(engine.encode(render("reverse: apple stone river")))
    assert result.completion_tokens == len(result.token_ids)


def test_remove_drops_a_row_between_steps_and_the_rest_continue(demo, render):
    from aieng.engine import GenerationRequest

    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    params = SamplingParams(max_tokens=20, temperature=0)
    expected = engine.generate([render("json: name=ana age=31")], params)[0].token_ids
    events = engine.prefill(
        [
            GenerationRequest("keep", engine.encode(render("json: name=ana age=31")), params),
            GenerationRequest("drop", engine.encode(render("reverse: boat door glass milk road")), params),
        ]
    )
    events += engine.decode()
    assert engine.remove(["drop", "unknown"]) == ["drop"]
    assert engine.running_ids() == ["keep"] and engine.runner.decoding_ids() == ["keep"]
    while engine.num_running:
        events += engine.decode()
    assert tuple(e.token_id for e in events if e.request_id == "keep") == expected
    assert len([e for e in events if e.request_id == "drop"]) == 2  # nothing after removal
