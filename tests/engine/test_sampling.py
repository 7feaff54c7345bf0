from dataclasses import replace

import torch

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.sampling import apply_repetition_penalty, filter_top_k_top_p, new_generator, sample_row

EAGER = EngineConfig(compile=False)  # the compiled path has its own tests (test_compile.py)


def test_repetition_penalty_follows_hf_semantics():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    out = apply_repetition_penalty(logits, torch.tensor([0, 1]), 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]


def test_top_k_and_top_p_filters():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isinf(filter_top_k_top_p(logits, 2, 1.0)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_top_k_top_p(logits, 0, 0.7)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_top_k_top_p(logits, 0, 0.1)).tolist() == [False, True, True, True]  # keeps the top one
    assert not torch.isinf(filter_top_k_top_p(logits, 0, 1.0)).any()


def test_sampling_is_reproducible_per_seed_and_varies_across_seeds():
    logits = torch.zeros(50)

    def draw(seed):
        generator = new_generator(seed, torch.device("cpu"))
        return [sample_row(logits, SamplingParams(temperature=1.0), generator, None) for _ in range(20)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_top_k_1_and_tiny_top_p_equal_greedy(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    prompt = render("json: name=bob age=17")
    greedy = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0))[0].text
    assert engine.generate([prompt], SamplingParams(max_tokens=16, temperature=1.5, top_k=1, seed=3))[0].text == greedy
    assert (
        engine.generate([prompt], SamplingParams(max_tokens=16, temperature=1.5, top_p=1e-6, seed=3))[0].text == greedy
    )


def test_a_seeded_row_is_reproducible_whatever_its_batch_mates(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    seeded = SamplingParams(max_tokens=20, temperature=1.3, seed=1234)
    alone = engine.generate([render("sort: river apple stone")], seeded)[0].token_ids
    mates = [render("add: 11+22"), render("reverse: egg fish gold hill ice"), render("sort: river apple stone")]
    params = [
        SamplingParams(max_tokens=20, temperature=0.9, seed=5),
        SamplingParams(max_tokens=7, temperature=0),
        seeded,
    ]
    in_batch = engine.generate(mates, params)[2].token_ids
    assert in_batch == alone


def test_high_temperature_without_seed_gives_varied_output(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    outs = {
        engine.generate([render("reverse: apple stone river")], SamplingParams(max_tokens=12, temperature=5.0))[0].text
        for _ in range(5)
    }
    assert len(outs) > 1


def test_repetition_penalty_changes_the_output(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    prompt = render("reverse: stone stone stone stone")
    plain = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0))[0].text
    penalised = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0, repetition_penalty=5.0))[0].text
    assert plain != penalised


def test_presence_frequency_penalties_and_logit_bias_follow_openai():
    from aieng.engine.sampling import adjust_logits

    logits = torch.zeros(2, 5)
    params = [SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((4, 3.0),)), SamplingParams()]
    out = adjust_logits(logits, params, [[1, 1, 2], [1]])
    # token 1 twice: 0.5 + 2 x 0.25; token 2 once: 0.5 + 0.25; token 4 biased; row 1 untouched
    assert out[0].tolist() == [0.0, -1.0, -0.75, 0.0, 3.0] and out[1].tolist() == [0.0] * 5
    assert logits.abs().sum() == 0  # the raw logits (for logprobs) are not changed
    assert adjust_logits(logits, [SamplingParams()] * 2, [[], []]) is logits


def test_penalties_and_bias_change_what_a_greedy_row_writes(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EAGER)
    prompt = render("add: 2+3")  # one-digit sums are outside the demo's training
    # Past its answer (EOS ignored) a greedy row repeats tokens; which ones depends on the CPU the
    # demo was trained on ("5888" on one, "4310" then repeats on another), so count repeats.
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    plain = engine.generate([prompt], params)[0].token_ids
    penalised = engine.generate([prompt], replace(params, frequency_penalty=2.0, presence_penalty=2.0))[0].token_ids

    def repeats(ids):
        return len(ids) - len(set(ids))

    assert repeats(plain) > repeats(penalised), (plain, penalised)
    seven = tokenizer.encode("7", add_special_tokens=False)[0]
    biased = engine.generate([prompt], SamplingParams(max_tokens=6, temperature=0, logit_bias=((seven, 100.0),)))[0]
    assert biased.text == "777777"


def test_a_knob_that_overflows_the_float_range_samples_its_limit_instead_of_raising():
    """A valid but extreme repetition penalty (1e-300: a positive seen logit becomes +inf) or
    logits already infinite or NaN (a float16 model's overflow): the draw takes the limit of the
    distribution, the tokens at +inf, rather than failing the request in the sampling."""
    logits = torch.tensor([3.0, 1.0, -2.0, 0.5])
    seen = torch.tensor([0, 1])
    tiny = SamplingParams(temperature=1.0, repetition_penalty=1e-300)
    draws = {sample_row(logits.clone(), tiny, new_generator(seed, torch.device("cpu")), seen) for seed in range(20)}
    assert draws == {0, 1}  # both seen tokens overflowed to +inf and share the mass
    assert sample_row(logits.clone(), replace(tiny, temperature=0.0), new_generator(0, torch.device("cpu")), seen) == 0
    broken = torch.tensor([float("nan"), float("inf"), 1.0, float("-inf")])
    assert sample_row(broken, SamplingParams(temperature=0.7), new_generator(1, torch.device("cpu")), None) == 1
