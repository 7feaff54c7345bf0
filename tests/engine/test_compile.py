"""The compiled forward (what `aieng serve` runs by default): same tokens as eager, no graph
compiled after warm-up whatever the batch does, and a clean fall-back when compile fails.

Both runners: the native forward compiles one decoder layer (``compiled_engine``), the
transformers forward the whole model (``compiled_hf_engine``, with its warm/rewarm states)."""

import logging
import random

import pytest
import torch
from torch._dynamo.utils import counters

from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from aieng.engine.native.graphs import build_head
from aieng.engine.native.runner import GraphShape

EAGER = EngineConfig.exact(compile=False)  # the compiled path has its own tests (test_compile.py)

TASKS = [
    "reverse: apple stone river",
    "add: 27+58",
    "json: name=ana age=31 city=oslo",
    "sort: river apple stone",
    "reverse: boat door glass milk road",
    "sort: zoo oak moon king",
    "add: 3+4",
    "json: color=red score=7",
]


def run_schedule(engine: Engine, render, seed: int = 0, steps: int = 120) -> dict[str, list[int]]:
    """Rows join in groups of mixed prompt lengths (one prompt of a single token), some are
    cancelled, the rest run to max_tokens."""
    rng = random.Random(seed)
    produced: dict[str, list[int]] = {}
    for step in range(steps):
        if step % 7 == 0:
            group = []
            for i in range(rng.randint(1, 5)):
                rid = f"s{step}-{i}"
                produced[rid] = []
                params = SamplingParams(max_tokens=rng.randint(2, 30), temperature=0, ignore_eos=True)
                ids = engine.encode(render(rng.choice(TASKS)))
                group.append(GenerationRequest(rid, ids[:1] if step == 14 and i == 0 else ids, params))
            events = engine.prefill(group)
        else:
            events = []
        if step % 11 == 5 and engine.num_running > 1:
            engine.remove(engine.running_ids()[:1])
        events += engine.decode()
        for event in events:
            produced[event.request_id].append(event.token_id)
    engine.remove(engine.running_ids())
    return produced


@pytest.fixture(scope="module")
def compiled_engine(demo):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=True))
    engine.warmup()
    return engine


@pytest.fixture(scope="module")
def compiled_hf_engine(demo):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, native=False))
    engine.warmup()
    return engine


@pytest.mark.parametrize("engine_fixture", ["compiled_engine", "compiled_hf_engine"])
def test_compiled_decode_matches_eager_and_compiles_nothing_after_warmup(engine_fixture, demo, render, request):
    model, tokenizer = demo
    compiled_engine = request.getfixturevalue(engine_fixture)
    graphs_after_warmup = counters["stats"]["unique_graphs"]
    compiled = run_schedule(compiled_engine, render)
    eager = run_schedule(Engine(model, tokenizer, config=EAGER), render)
    assert compiled == eager
    assert compiled_engine.compiled
    assert compiled_engine.stats["rewarms"] == 0 and compiled_engine.stats["compile_fallbacks"] == 0
    assert counters["stats"]["unique_graphs"] == graphs_after_warmup, "a decode step compiled a new graph"


def run_joining_schedule(engine: Engine, render, seed: int = 1) -> dict[str, list[int]]:
    """Serving's steps: requests join one or several at a time while others decode, so most
    steps carry decode rows and prompt chunks together (``Engine.step``)."""
    rng = random.Random(seed)
    produced: dict[str, list[int]] = {}
    step = 0
    while step < 40 or engine.num_running:
        joiners = []
        if step < 40 and step % 4 == 0:
            for i in range(rng.choice([1, 1, 2, 3])):
                rid = f"j{step}-{i}"
                produced[rid] = []
                params = SamplingParams(max_tokens=rng.randint(6, 20), temperature=0, ignore_eos=True)
                joiners.append(GenerationRequest(rid, engine.encode(render(rng.choice(TASKS))), params))
        for event in engine.step(joiners).events:
            produced[event.request_id].append(event.token_id)
        step += 1
    return produced


def test_steps_that_mix_decode_rows_and_prompt_chunks_run_compiled_and_match_eager(compiled_engine, demo, render):
    """Under load most steps carry joining prompts beside decoding rows: those run in the mixed
    graphs warm-up built (one chunk, several chunks), with the tokens eager gives, and need no
    graph that warm-up did not build."""
    model, tokenizer = demo
    graphs_after_warmup = counters["stats"]["unique_graphs"]
    runner = compiled_engine.runner
    before = runner.steps_by_graph.copy()
    compiled = run_joining_schedule(compiled_engine, render)
    ran = runner.steps_by_graph - before
    eager = run_joining_schedule(Engine(model, tokenizer, config=EAGER), render)
    assert compiled == eager
    assert ran[GraphShape(2, 1, False)] > 0 and ran[GraphShape(2, 2, False)] > 0, ran
    assert counters["stats"]["unique_graphs"] == graphs_after_warmup, "a step compiled a new graph"


def test_a_decode_form_warmup_missed_turns_full_guards_back_on(compiled_hf_engine, render):
    compiled_engine = compiled_hf_engine
    real = compiled_engine.runner.forward_fn._compiled
    calls = {"n": 0}

    def flaky(**kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("Recompilation triggered with skip_guard_eval_unsafe stance.")
        return real(**kwargs)

    compiled_engine.runner.forward_fn._compiled = flaky
    try:
        out = compiled_engine.generate([render(TASKS[0])], SamplingParams(max_tokens=6, temperature=0))[0]
        warmed_again = compiled_engine.runner.forward_fn.warm
    finally:
        compiled_engine.runner.forward_fn._compiled = real
        compiled_engine.runner.forward_fn.mark_warm()
    assert out.completion_tokens == 6 or out.finish_reason == "stop"
    # at least the injected miss; on some CPUs the call compiled with full guards leaves the next
    # form to be re-guarded once more (seen on a new CI machine): recovered either way
    assert 1 <= compiled_engine.stats["rewarms"] <= 2 and compiled_engine.compiled
    assert warmed_again, "after the missing graph is built, guards are skipped again"


def test_a_model_error_inside_a_compiled_call_is_raised_and_keeps_compile_on(compiled_hf_engine, render):
    compiled_engine = compiled_hf_engine
    real = compiled_engine.runner.forward_fn._compiled

    def broken(**kwargs):
        raise ValueError("a bug in the model, not in the compiler")

    compiled_engine.runner.forward_fn._compiled = broken
    try:
        with pytest.raises(ValueError, match="a bug in the model"):
            compiled_engine.generate([render(TASKS[2])], SamplingParams(max_tokens=4, temperature=0))
    finally:
        compiled_engine.runner.forward_fn._compiled = real
        compiled_engine.remove(compiled_engine.running_ids())
    assert compiled_engine.compiled and compiled_engine.stats["compile_fallbacks"] == 0


def test_the_one_row_output_projection_compiles_where_one_call_does_not_serve_the_row_and_matches_eager(
    compiled_engine,
):
    net = compiled_engine.runner.net
    assert net.one_row is not None and not net.head_ready  # the op serves the row: its projection stays eager
    build_head(net, bf16=False, progress=lambda detail: None)  # what warm-up does for a model the op does not fit
    try:
        assert net.head_ready
        hidden = torch.randn(1, net.final_norm.shape[0])
        with torch.inference_mode():
            compiled = net.logits(hidden, compiled=True)
            eager = net.logits(hidden)
        assert compiled.shape == eager.shape and compiled.dtype == torch.float32
        assert torch.allclose(compiled, eager, atol=1e-4, rtol=1e-4)
        two = torch.randn(2, net.final_norm.shape[0])
        with torch.inference_mode():  # more rows than one never take the one-row graph
            assert torch.equal(net.logits(two, compiled=True), net.logits(two))
    finally:
        net.head_ready = False


def test_a_prompt_that_reaches_an_idle_engine_prefills_in_its_own_graph_and_matches_eager(
    compiled_engine, demo, render
):
    """The prefill of a lone user's request, once per request: compiled (``GraphShape(0, 1)``),
    whatever the prompt's length (one token, where a span of 1 would need a graph of its own), with
    eager's tokens and no graph built after warm-up."""
    model, tokenizer = demo
    graphs = counters["stats"]["unique_graphs"]
    runner = compiled_engine.runner
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    eager = Engine(model, tokenizer, config=EAGER)
    for ids in (compiled_engine.encode(render(TASKS[2])), compiled_engine.encode(render(TASKS[6])), [1]):
        before = runner.steps_by_graph.copy()
        got = compiled_engine.generate([ids], params)[0]
        assert (runner.steps_by_graph - before)[GraphShape(0, 1, False)] == 1
        assert got.token_ids == eager.generate([ids], params)[0].token_ids
    assert counters["stats"]["unique_graphs"] == graphs, "a prefill compiled a new graph"


@pytest.mark.parametrize("engine_fixture", ["compiled_engine", "compiled_hf_engine"])
def test_a_lone_one_token_prompt_needs_no_new_graph(engine_fixture, request):
    compiled_engine = request.getfixturevalue(engine_fixture)
    graphs = counters["stats"]["unique_graphs"]
    rewarms = compiled_engine.stats["rewarms"]
    assert compiled_engine.num_running == 0
    out = compiled_engine.generate([[1]], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))[0]
    assert out.completion_tokens == 5
    assert compiled_engine.stats["rewarms"] == rewarms and counters["stats"]["unique_graphs"] == graphs


def test_compile_failure_falls_back_to_eager_and_keeps_serving(demo, render, caplog):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, native=False))

    def broken(**kwargs):
        raise torch._dynamo.exc.Unsupported("this model cannot be traced")  # what a failed trace raises

    engine.runner.forward_fn._compiled = broken
    params = SamplingParams(max_tokens=8, temperature=0)
    got = engine.generate([render(TASKS[1])], params)[0]
    want = Engine(model, tokenizer, config=EAGER).generate([render(TASKS[1])], params)[0]
    assert got.token_ids == want.token_ids
    assert not engine.compiled and engine.stats["compile_fallbacks"] == 1
    assert any("continuing eagerly" in r.getMessage() for r in caplog.records)


def test_native_layer_compile_failure_falls_back_to_eager_and_keeps_serving(demo, render, caplog):
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=True))

    def broken(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("this layer cannot be traced")

    engine.runner.net.compiled_stack = broken
    engine.runner.compiled_ready = True  # as if warm-up had built the graphs
    params = SamplingParams(max_tokens=8, temperature=0)
    prompts = [render(TASKS[1]), render(TASKS[2])]  # two decode rows: one row runs in no graph (one_row)
    got = engine.generate(prompts, params)
    want = Engine(model, tokenizer, config=EAGER).generate(prompts, params)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert not engine.compiled and engine.compile_status == "failed"
    assert any("continuing eagerly" in r.getMessage() for r in caplog.records)


def test_past_its_budget_compilation_goes_on_in_the_background_while_the_engine_serves(demo, render):
    model, tokenizer = demo
    engine = Engine(
        model,
        tokenizer,
        config=EngineConfig.exact(
            compile=True, compile_budget_s=0.0, warmup_batch_sizes=(1,), warmup_prompt_lengths=(8,)
        ),
    )
    details = []
    engine.warmup(progress=details.append)
    assert any("compiling the decoder layer" in d for d in details) or engine.compile_status == "compiling"
    params = SamplingParams(max_tokens=8, temperature=0)
    served = engine.generate([render(TASKS[0])], params)[0]  # eagerly, or compiled if it already finished
    engine.wait_for_compile(timeout=300)
    assert engine.compile_status == "compiled" and engine.compiled
    again = engine.generate([render(TASKS[0])], params)[0]
    assert served.token_ids == again.token_ids


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_the_layer_is_traced_once_and_stamped_out_for_every_other_layer(demo):
    """Compile time independent of depth: dynamo traces the decoder layer once per graph and reuses
    that trace for the other layers (torch logs each reuse on its hierarchical_compile channel).
    A model of its own shape, so no graph another test built is found in dynamo's cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = demo
    torch.manual_seed(0)
    layers = 4
    config = LlamaConfig(
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=128,
    )
    engine = Engine(LlamaForCausalLM(config).eval(), tokenizer, config=EngineConfig.exact(compile=True, max_rows=4))
    records = _Records()
    channel = logging.getLogger("torch._dynamo.variables.invoke_subgraph")
    channel.addHandler(records)
    torch._logging.set_logs(hierarchical_compile=True)
    try:
        engine.runner.build_graphs()
    finally:
        torch._logging.set_logs()
        channel.removeHandler(records)
    graphs = len(engine.runner.compile_shapes())
    reused = [m for m in records.messages if "subgraph_reuse: cache hit" in m]
    refused = [m for m in records.messages if "not eligible" in m or "reuse failed" in m]
    assert refused == [] and len(reused) == graphs * (layers - 1), records.messages


@pytest.mark.parametrize(
    "bf16_from, want",
    [
        ((), [(1, 0, False), (2, 0, False), (0, 1, False), (2, 1, False), (2, 2, False)]),
        (
            ((1, False), (8, True)),
            [(1, 0, False), (2, 0, False), (2, 0, True), (0, 1, False), (0, 1, True)]
            + [(2, 1, False), (2, 1, True), (2, 2, False), (2, 2, True)],
        ),
        # the plan moved: the same graphs, so a restart finds them in the compile cache
        (
            ((1, False), (16, True)),
            [(1, 0, False), (2, 0, False), (2, 0, True), (0, 1, False), (0, 1, True)]
            + [(2, 1, False), (2, 1, True), (2, 2, False), (2, 2, True)],
        ),
        (((1, True),), [(1, 0, True), (2, 0, True), (0, 1, True), (2, 1, True), (2, 2, True)]),
        (
            ((1, False), (4, True)),
            [(1, 0, False), (2, 0, False), (2, 0, True), (0, 1, False), (0, 1, True), (2, 1, True), (2, 2, True)],
        ),
    ],
)
def test_the_graphs_built_do_not_depend_on_where_the_measured_plan_switches_format(demo, bf16_from, want):
    from aieng.engine.native.formats import FormatPlan

    model, tokenizer = demo
    runner = Engine(model, tokenizer, config=EngineConfig.exact(compile=True)).runner
    runner.formats = FormatPlan(bf16_from=bf16_from)
    assert runner.compile_shapes() == [GraphShape(*t) for t in want]


def test_a_measured_plan_times_the_compiled_one_row_step_in_both_formats(demo, caplog):
    """The eager plan's timings say nothing about the compiled one-row kernel inductor generates:
    with ``auto`` both one-row graphs are built and timed, and the faster one serves."""
    from dataclasses import replace

    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, weight_formats="auto"))
    runner = engine.runner
    runner.formats = replace(runner.formats, one_row_margin=None)  # whatever the demo's eager timings said
    assert runner.formats.measured and {GraphShape(1, 0, False), GraphShape(1, 0, True)} <= set(runner.compile_shapes())
    with caplog.at_level(logging.INFO, logger="aieng.engine"):
        engine.warmup()
    timed = [r for r in caplog.records if getattr(r, "one_row", None)]
    assert runner.timed_one_row_bf16 is not None and len(timed) == 1
    assert timed[0].one_row == ("bf16" if runner.one_row_bf16 else "fp32") and timed[0].fp32_ms > 0
    # The bf16 copies are dropped once no step can use them.
    unused = not runner.one_row_bf16 and not runner.formats.uses_bf16
    assert (runner.net.layers_bf16 is None) == unused and (runner.net.lm_head_bf16 is None) == unused


@pytest.mark.parametrize(
    ("one_row_margin", "one_row_graphs"),
    [(None, [(1, 0, False), (1, 0, True)]), (1.2, [(1, 0, False), (1, 0, True)]), (3.0, [(1, 0, True)])],
)
def test_a_format_that_wins_one_row_clearly_eager_is_the_only_one_row_graph(demo, one_row_margin, one_row_graphs):
    """Eager bf16 three times faster than fp32 at one token: the compiled fp32 graph cannot catch up
    (both stream through the same kernel, bf16 reads half the bytes), so it is not built or raced."""
    from aieng.engine.native.formats import FormatPlan, plan_from_timings

    model, tokenizer = demo
    runner = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, weight_formats="auto")).runner
    runner.net.layers_bf16 = runner.net.layers_bf16 or [w.to(torch.bfloat16) for w in runner.net.layers]
    runner.formats = FormatPlan(((1, True),), measured=True, one_row_margin=one_row_margin)
    assert [s for s in runner.compile_shapes() if s.rows == 1] == [GraphShape(*t) for t in one_row_graphs]
    clear_loss = FormatPlan(((1, False),), measured=True, one_row_margin=0.5)  # fp32 clearly ahead
    assert clear_loss.clear_at_one_row and not FormatPlan(measured=True, one_row_margin=0.9).clear_at_one_row
    assert plan_from_timings({1: (3e-3, 1e-3, 4e-3, 2e-3)}).one_row_margin == pytest.approx(3.0)  # best layouts


def test_a_fixed_format_builds_one_graph_for_one_row_and_times_nothing(demo):
    model, tokenizer = demo
    runner = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, weight_formats="float32")).runner
    assert runner.net.layers_bf16 is None and [s for s in runner.compile_shapes() if s.rows == 1] == [
        GraphShape(1, 0, False)
    ]
    runner.build_graphs()
    assert runner.timed_one_row_bf16 is None and runner.one_row_bf16 is False


@pytest.mark.parametrize("rows", [24, 6, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", [False, True], ids=["streamed_matvec", "aieng_matvec"])
def test_the_compiled_one_row_product_matches_the_exact_product_without_rounding_the_input(rows, dtype, kernel):
    from aieng.engine.native import kernels
    from aieng.engine.native.compile_marks import own_copy
    from aieng.engine.native.llama import Dims, linear

    assert not kernel or kernels.load() is None
    torch.manual_seed(0)
    x, weight = torch.randn(1, 48), torch.randn(rows, 48).to(dtype)
    dims = Dims(1, 1, 48, 1e-6, matvec_kernel=kernel)
    got = torch.compile(own_copy(linear), fullgraph=True, dynamic=False)(x, weight, None, dims)
    exact = x.double() @ weight.double().T  # bf16 weights widen exactly; the input stays fp32
    assert got.shape == (1, rows) and got.dtype == torch.float32
    assert torch.allclose(got.double(), exact, atol=1e-4, rtol=1e-5)


def test_without_compilation_a_measured_plan_keeps_a_bf16_copy_only_if_it_uses_bf16(demo):
    model, tokenizer = demo
    runner = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, weight_formats="auto")).runner
    assert runner.formats.measured
    assert (runner.net.layers_bf16 is not None) == runner.formats.uses_bf16


def test_a_second_engine_of_the_same_layout_shares_the_graphs_and_compiles_nothing(compiled_engine, demo, qwen, render):
    """What a hot swap between versions of one architecture relies on: the new engine's warm-up
    reuses the serving engine's compiled stack (weights are inputs), and answers the same."""
    model, tokenizer = demo
    second = Engine(model, tokenizer, config=EngineConfig.exact(compile=True), replacing=compiled_engine)
    assert second.shared_graphs
    counters.clear()
    second.warmup()
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])  # nothing traced or compiled
    params = SamplingParams(max_tokens=8, temperature=0)
    prompts = [render("reverse: abcd"), render("add: 12+30")]
    assert second.generate(prompts, params) == compiled_engine.generate(prompts, params)
    other_model, other_tokenizer = qwen
    other = Engine(other_model, other_tokenizer, config=EngineConfig.exact(compile=True), replacing=compiled_engine)
    assert not other.shared_graphs  # another layout keeps graphs of its own
    assert Engine(model, tokenizer, config=EngineConfig.exact(compile=True)).shared_graphs is False


def test_a_successor_of_a_measured_engine_takes_its_formats_and_measures_nothing(demo, caplog):
    """The hot swap under load that spent 10 s compiling beside the serving engine: the serving
    engine had timed its one-row step, chosen fp32 and dropped its bf16 copy, while the new
    engine measured a plan of its own (under load, so a different one) and kept a bf16 copy, so
    the layouts differed and nothing was shared. The successor now takes the plan, the one-row
    choice and the copy's absence from the engine it replaces."""
    model, tokenizer = demo
    config = EngineConfig.exact(compile=True, weight_formats="auto")
    serving = Engine(model, tokenizer, config=config)
    serving.warmup()
    runner = serving.runner
    if not runner.formats.uses_bf16:  # what build_graphs does when fp32 wins the one-row timing
        runner.timed_one_row_bf16, runner.net.layers_bf16 = False, None
    with caplog.at_level(logging.INFO, logger="aieng.engine"):
        successor = Engine(model, tokenizer, config=config, replacing=serving)
        counters.clear()
        successor.warmup()
    assert successor.shared_graphs and successor.runner.formats is runner.formats
    assert successor.runner.one_row_bf16 == runner.one_row_bf16
    assert (successor.runner.net.layers_bf16 is None) == (runner.net.layers_bf16 is None)
    assert not [r for r in caplog.records if getattr(r, "event", None) == "engine_weight_formats"]
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])


def test_engines_sharing_one_kv_cache_through_a_swap_run_the_graphs_they_have(compiled_engine, demo, render):
    """The old engine's cache becomes a view of the top slots (an offset into the allocation),
    the successor's a view of the bottom ones, then the whole: no step of either compiles."""
    from aieng.engine.native.succession import hand_over_cache, reclaim_cache, take_cache

    model, tokenizer = demo
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompts = [tokenizer.encode(render(t)) for t in TASKS[:6]]
    want = [r.token_ids for r in compiled_engine.generate(prompts, params)]
    counters.clear()  # from here, warm-ups included, nothing compiles
    old = Engine(model, tokenizer, config=EngineConfig.exact(compile=True), replacing=compiled_engine)
    old.warmup()
    new = Engine(model, tokenizer, config=EngineConfig.exact(compile=True), replacing=old, kv_from_replaced=True)
    new.warmup()  # on a scratch cache, its graphs for the rows it will hold (not the 0 it holds now)
    done, first = {}, [GenerationRequest(f"p{i}", list(p), params) for i, p in enumerate(prompts[:3])]
    for event in old.step(first).events + old.step().events:
        assert not event.finished
    handover = hand_over_cache(old, queued=0)
    take_cache(new, handover)
    old_compiled_before = sum(n for graph, n in old.runner.steps_by_graph.items() if graph is not None)
    joiners = [GenerationRequest(f"p{i}", list(p), params) for i, p in enumerate(prompts[3:], 3)]
    while old.rows or new.rows or joiners:
        if not old.rows and handover:
            reclaim_cache(new, handover)
            handover = None
        events = (old.step().events if old.rows else []) + new.step(joiners).events
        joiners = []
        done.update({e.request_id: e.token_ids for e in events if e.finished})
    assert [done[f"p{i}"] for i in range(6)] == want
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])

    def compiled(engine):
        return sum(n for graph, n in engine.runner.steps_by_graph.items() if graph is not None)

    assert compiled(old) > old_compiled_before and compiled(new) > 0  # both sides ran graphs on their views
