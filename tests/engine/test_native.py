"""The native forward: a static slot cache written in place, prompts prefilled in chunks mixed
with decode steps, a KV budget that bounds the rows, bf16 weights for small steps — and greedy
tokens identical to transformers' generate() through all of it."""

import pytest
import torch

from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from aieng.engine.native.slots import SlotKVCache, SlotShape, plan_slots
from aieng.engine.reference import reference_greedy
from aieng.errors import AiengError

PROMPTS = ["reverse: apple stone river", "add: 27+58", "json: name=ana age=31 city=oslo", "sort: river apple stone"]


@pytest.fixture(scope="module")
def tiny(tiny_shape_model_dir):
    """A random Llama with grouped-query attention (4 heads, 2 KV heads)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_shape_model_dir, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)


def greedy_reference(engine, model, prompts, n):
    return reference_greedy(
        model, [engine.encode(p) for p in prompts], max_new_tokens=n, eos_ids=engine.eos_ids, pad_id=engine.pad_id
    )


@pytest.mark.parametrize("arch", ["demo", "tiny", "qwen"])
@pytest.mark.parametrize("chunk", [3, 256])
def test_chunked_prefill_gives_generate_s_tokens(arch, chunk, request, render):
    model, tokenizer = request.getfixturevalue(arch)
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, prefill_chunk_tokens=chunk))
    assert type(engine.runner).__name__ == "NativeRunner"
    prompts = [render(p) for p in PROMPTS] + [render("reverse: " + " ".join(["stone"] * 12))]
    got = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=arch != "demo"))
    if arch == "demo":
        assert [r.token_ids for r in got] == greedy_reference(engine, model, prompts, 16)
    else:  # random weights have near-ties that float noise can flip: every pick must be a top logit
        for prompt, result in zip(prompts, got):
            assert_greedy_up_to_ties(model, engine.encode(prompt), result.token_ids)


def assert_greedy_up_to_ties(model, prompt_ids, generated, tolerance=1e-4):
    """Each generated token is, under transformers' own forward of the whole sequence, the most
    likely next token or within ``tolerance`` of it."""
    ids = torch.tensor([list(prompt_ids) + list(generated)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    picked = logits.gather(-1, torch.tensor(list(generated))[:, None])[:, 0]
    assert bool((logits.max(-1).values - picked <= tolerance).all()), logits.max(-1).values - picked


def test_a_long_prompt_joins_in_chunks_while_running_rows_keep_decoding(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, prefill_chunk_tokens=8))
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    running = [GenerationRequest(f"r{i}", engine.encode(render(p)), params) for i, p in enumerate(PROMPTS[:2])]
    engine.prefill(running)
    long_ids = engine.encode(render("reverse: " + " ".join(["stone", "apple", "river"] * 12)))
    assert len(long_ids) > 40
    step = engine.step([GenerationRequest("long", long_ids, params)])
    steps_to_join = 1
    while not any(e.request_id == "long" for e in step.events):
        assert {e.request_id for e in step.events} == {"r0", "r1"}, "every running row got its token this step"
        step = engine.step()
        steps_to_join += 1
    assert steps_to_join == -(-len(long_ids) // 8)  # one 8-token chunk per step
    engine.remove(engine.running_ids())


def test_the_cache_is_allocated_once_and_written_in_place(demo, render):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig(compile=False, max_rows=4))
    cache = engine.runner.cache
    pointers = [t.data_ptr() for t in cache.keys + cache.values]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    engine.generate([render(p) for p in PROMPTS * 2], params)  # 8 prompts through 4 slots
    assert [t.data_ptr() for t in cache.keys + cache.values] == pointers
    assert cache.free == 4 and cache.decoding == []


def test_kv_budget_bounds_the_rows_and_extra_prompts_wait(demo, render):
    model, tokenizer = demo
    probe = Engine(model, tokenizer, config=EngineConfig(compile=False, max_rows=1))
    row_bytes = probe.runner.cache.nbytes
    engine = Engine(model, tokenizer, config=EngineConfig(compile=False, max_rows=8, kv_cache_bytes=3 * row_bytes))
    assert engine.max_rows == 3
    params = SamplingParams(max_tokens=10, temperature=0)
    got = engine.generate([render(p) for p in PROMPTS], params)
    assert [r.token_ids for r in got] == [probe.generate([render(p)], params)[0].token_ids for p in PROMPTS]


def test_a_budget_below_one_row_is_a_clear_error(demo):
    model, tokenizer = demo
    with pytest.raises(AiengError, match="AIENG_KV_CACHE_MB"):
        Engine(model, tokenizer, config=EngineConfig(compile=False, kv_cache_bytes=1024))


@torch.inference_mode()  # the cache holds inference tensors, as the engine writes them
def test_slots_stay_packed_when_rows_leave_and_join():
    shape = SlotShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32)
    cache = SlotKVCache(shape, slots=3, capacity=4, device=torch.device("cpu"))
    for rid in "abc":
        slot = cache.acquire(rid)
        cache.keys[0][slot, 0, 0] = ord(rid)
        cache.lengths[slot] = 1
        cache.start_decoding([rid][0])
    with pytest.raises(AiengError, match="slots"):
        cache.acquire("d")
    cache.release("a")  # c moves into slot 0 with its keys
    assert cache.decoding == ["c", "b"] and cache.slot_of == {"c": 0, "b": 1}
    assert cache.keys[0][0, 0, 0, 0] == ord("c") and cache.lengths == [1, 1, 0] and cache.owner == ["c", "b", None]
    cache.release("b")  # the last decoding row leaves: nothing moves
    assert cache.decoding == ["c"] and cache.slot_of == {"c": 0} and cache.owner == ["c", None, None]
    assert cache.acquire("d") == 1 and cache.lengths[1] == 0
    assert plan_slots(shape, budget_bytes=10**9, capacity=4, max_rows=5) == 5


@torch.inference_mode()
def test_a_row_that_starts_decoding_moves_down_into_a_free_slot_or_swaps_with_a_prefilling_row():
    shape = SlotShape(layers=1, kv_heads=1, head_dim=2, dtype=torch.float32)
    cache = SlotKVCache(shape, slots=3, capacity=4, device=torch.device("cpu"))
    for rid in "abc":
        slot = cache.acquire(rid)
        cache.keys[0][slot, 0, :2] = ord(rid)
        cache.lengths[slot] = 2
    cache.release("a")  # still prefilling: slot 0 is free
    cache.start_decoding("c")  # moves into the free slot 0
    assert cache.slot_of == {"c": 0, "b": 1} and cache.owner == ["c", "b", None] and cache.lengths == [2, 2, 0]
    assert bool((cache.keys[0][0, 0, :2] == ord("c")).all())
    cache.acquire("d")  # slot 2
    cache.keys[0][2, 0, :2] = ord("d")
    cache.lengths[2] = 2
    cache.start_decoding("d")  # slot 1 holds b, still prefilling: they swap
    assert cache.slot_of == {"c": 0, "d": 1, "b": 2} and cache.decoding == ["c", "d"]
    assert bool((cache.keys[0][1, 0, :2] == ord("d")).all()) and bool((cache.keys[0][2, 0, :2] == ord("b")).all())


def test_bf16_weights_for_small_steps_stay_close_to_fp32(demo, render):
    model, tokenizer = demo
    prompts = [render(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=16, temperature=0)
    fp32 = Engine(model, tokenizer, config=EngineConfig.exact(compile=False)).generate(prompts, params)
    bf16_engine = Engine(model, tokenizer, config=EngineConfig(compile=False, weight_formats="bfloat16"))
    assert bf16_engine.runner.net.layers_bf16[0].qkv.dtype == torch.bfloat16
    bf16 = bf16_engine.generate(prompts, params)
    assert sum(a.text == b.text for a, b in zip(fp32, bf16)) >= 3  # the demo's answers survive bf16


def test_the_output_projection_runs_in_the_steps_format_and_its_bytes_count_in_the_step(tiny, render):
    """On a 150k-token vocabulary the output matrix is a third of what a one-row step reads: in bf16
    steps it is read from a bf16 copy, and the step's bytes (the batch-1 ceiling) say so."""
    model, tokenizer = tiny
    fp32 = Engine(model, tokenizer, config=EngineConfig.exact(compile=False)).runner
    bf16 = Engine(model, tokenizer, config=EngineConfig(compile=False, weight_formats="bfloat16")).runner
    assert fp32.net.lm_head_bf16 is None and bf16.net.lm_head_bf16.dtype == torch.bfloat16
    head = model.lm_head.weight
    assert fp32.one_row_step_bytes() - bf16.one_row_step_bytes() == head.nbytes // 2 + sum(
        m.nbytes // 2 for w in fp32.net.layers for m in w.matrices
    )
    hidden = torch.randn(3, model.config.hidden_size)
    exact, halved = fp32.net.logits(hidden), bf16.net.logits(hidden, bf16=True)
    assert exact.dtype == halved.dtype == torch.float32 and halved.shape == (3, model.config.vocab_size)
    assert torch.allclose(exact, halved, atol=0.05, rtol=0.02) and not torch.equal(exact, halved)


def test_every_step_says_where_its_time_went(tiny, render):
    import time

    from aieng.bench.step_profile import batch1_split

    model, tokenizer = tiny
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=False))
    assert engine.last_split is None
    ids = engine.encode(render("reverse: apple moon"))
    started = time.perf_counter()
    engine.prefill([GenerationRequest("a", ids, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))])
    wall = time.perf_counter() - started
    split = engine.last_split
    assert split.layers_s > 0 and split.head_s > 0 and split.sampling_s > 0 and split.other_s >= 0
    assert split.total_s <= wall
    ms = batch1_split(engine, ids, steps=6)
    assert set(ms) == {"step", "layers", "output_projection", "sampling", "other"}
    assert all(v > 0 for k, v in ms.items() if k != "other") and engine.num_running == 0
    hf = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, native=False))
    assert batch1_split(hf, ids, steps=3)["output_projection"] is None  # inside transformers' forward


def test_step_time_by_batch_size_interleaves_the_sizes_and_times_every_step(tiny, render):
    """Notebook 04's batch curve measures the sizes in interleaved rounds, so a neighbour busy for
    a moment slows every size alike rather than one: each round prefills every size in order."""
    from aieng.bench.step_profile import ms_per_step_by_batch

    model, tokenizer = tiny
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=False))
    prefilled, decoded = [], []
    prefill, decode = engine.prefill, engine.decode
    engine.prefill = lambda requests: prefilled.append(len(requests)) or prefill(requests)
    engine.decode = lambda: decoded.append(engine.num_running) or decode()
    rows = ms_per_step_by_batch(engine, engine.encode(render("add: 1+2")), [1, 4, 2], steps=6, rounds=3)
    assert prefilled == [1, 4, 2] * 3 and decoded == [1, 1, 4, 4, 2, 2] * 3 and engine.num_running == 0
    assert [r["batch_size"] for r in rows] == [1, 4, 2]
    for r in rows:
        assert r["ms_per_step"] > 0 and r["ms_per_token"] == pytest.approx(r["ms_per_step"] / r["batch_size"])
        assert r["tokens_per_s"] == pytest.approx(r["batch_size"] * 1000 / r["ms_per_step"])


def test_the_format_plan_is_measured_per_step_size_and_picks_by_token_count(demo):
    from aieng.engine.native.formats import TOKEN_COUNTS, FormatPlan, measure_format_plan

    model, _ = demo
    measured = measure_format_plan(model, repeats=1)
    assert [count for count, _ in measured.bf16_from] == list(TOKEN_COUNTS)
    plan = FormatPlan(((1, True), (4, False), (32, True)))  # e.g. bandwidth wins small, bf16 units win large
    assert [plan.use_bf16(n) for n in (1, 3, 4, 31, 32, 500)] == [True, True, False, False, True, True]
    assert plan.describe() == "bf16 from 1 token, fp32 from 4 tokens, bf16 from 32 tokens"
    assert not FormatPlan().uses_bf16 and FormatPlan.fixed(True).use_bf16(7)


def test_the_cache_memory_is_claimed_and_zeroed_at_start(demo):
    """Attention reads masked positions past a row's length: they must be finite from the start."""
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig(compile=False, max_rows=2))
    cache = engine.runner.cache
    assert all(bool((t == 0).all()) for t in cache.keys + cache.values)
    assert cache.nbytes == 2 * model.config.num_hidden_layers * cache.keys[0].numel() * 4


def test_the_prefill_budget_follows_the_decode_pace():
    from aieng.engine.prefill_budget import PrefillBudget

    budget = PrefillBudget(max_tokens=256)
    assert budget.tokens(decoding=True) == budget.min_tokens  # nothing measured yet: a small chunk to learn from
    budget.observe(0.040, prompt_tokens=0, decoding=True)  # a decode step: 40 ms
    budget.observe(0.040 + 0.100, prompt_tokens=100, decoding=True)  # a chunk of 100 tokens added 100 ms
    assert budget.tokens(decoding=True) == 40  # a chunk may cost about one decode step
    assert budget.tokens(decoding=False) == 256  # nobody waiting: the whole budget, fastest first token
    budget.observe(0.040 + 100.0, prompt_tokens=100, decoding=True)  # very slow chunks: never below the floor
    assert budget.tokens(decoding=True) == budget.min_tokens
    assert PrefillBudget(max_tokens=8, decode_s=1.0, token_s=1e-6).tokens(decoding=True) == 8  # nor above the ceiling


@pytest.mark.parametrize(
    "fixed_s, token_s, decode_s, want",
    [
        (0.005, 0.001, 0.040, 35),  # a real model: per-token cost dominates, a chunk costs about one decode step
        (0.002, 0.00001, 0.001, 200),  # a tiny model: the fixed part alone exceeds a decode step, so amortise it
    ],
)
def test_the_prefill_budget_separates_a_chunks_fixed_cost_from_its_cost_per_token(fixed_s, token_s, decode_s, want):
    from aieng.engine.prefill_budget import PrefillBudget

    budget = PrefillBudget(max_tokens=512, decode_s=decode_s)
    for tokens in [16, 40, 24, 64, 32, 48] * 4:  # chunk sizes vary, as joining prompts do
        budget.observe(decode_s + fixed_s + token_s * tokens, prompt_tokens=tokens, decoding=True)
    fixed, per_token = budget.cost_model()
    assert fixed == pytest.approx(fixed_s, rel=0.01) and per_token == pytest.approx(token_s, rel=0.01)
    assert budget.tokens(decoding=True) == pytest.approx(want, abs=1)


def test_the_prefill_budget_uses_the_average_until_chunk_sizes_vary():
    from aieng.engine.prefill_budget import PrefillBudget

    budget = PrefillBudget(max_tokens=512, decode_s=0.040)
    for _ in range(5):
        budget.observe(0.040 + 0.005 + 0.001 * 32, prompt_tokens=32, decoding=True)
    assert budget.cost_model() == (0.0, pytest.approx(0.037 / 32))
    assert budget.tokens(decoding=True) == int(0.040 / (0.037 / 32))


def test_rotary_comes_from_a_table_except_for_length_dependent_types(tiny):
    """The table holds exactly what the model's rotary module computes; rotary types whose
    frequencies depend on the sequence length (dynamic NTK, longrope) keep computing per step."""
    model, tokenizer = tiny
    net = Engine(model, tokenizer, config=EngineConfig(compile=False)).runner.net
    positions = torch.tensor([0, 5, 17, 3])
    x = torch.zeros(4, model.config.hidden_size)
    cos, sin = net.rotary_at(x, positions)
    want_cos, want_sin = net.rotary(x[None], positions[None])
    assert net._rotary_table is not None
    assert torch.equal(cos, want_cos[0, :, None, :]) and torch.equal(sin, want_sin[0, :, None, :])
    net._rotary_table = None
    net.rotary.rope_type = "dynamic"
    try:
        net.build_rotary_table(64)
        assert net._rotary_table is None
    finally:
        net.rotary.rope_type = "default"


def test_layers_fused_before_the_engine_are_shared_not_copied_and_serve_the_same_tokens(tiny_shape_model_dir, render):
    """``fuse_layers`` is what the gunicorn master runs before fork: the engine built after it takes
    the fused matrices as they are (the same memory, so workers share the master's pages), the
    transformers modules stay views of them, and the tokens are those of an engine that fused itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aieng.engine.native.model import fuse_layers

    def load():
        return AutoModelForCausalLM.from_pretrained(tiny_shape_model_dir, local_files_only=True).eval()

    tokenizer = AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)
    config = EngineConfig.exact(compile=False, weight_formats="float32")
    prompts = [render(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    want = [r.token_ids for r in Engine(load(), tokenizer, config=config).generate(prompts, params)]

    model = load()
    fuse_layers(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv_at, gate_up_at = attn.q_proj.weight.data_ptr(), mlp.gate_proj.weight.data_ptr()
    engine = Engine(model, tokenizer, config=config)
    layer = engine.runner.net.layers[0]
    assert layer.qkv.data_ptr() == qkv_at and layer.gate_up.data_ptr() == gate_up_at  # no second copy
    assert attn.k_proj.weight.data_ptr() == qkv_at + attn.q_proj.weight.nbytes  # modules still views of it
    assert torch.equal(layer.qkv, torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert [r.token_ids for r in engine.generate(prompts, params)] == want
