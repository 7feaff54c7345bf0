"""oneDNN-packed weight copies: the same products as ``F.linear``, used only from ``min_rows``
rows, dropped with their weight, chosen by timing, and greedy decoding unchanged through them."""

import gc

import pytest
import torch
import torch.nn.functional as F

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.native import packed_weights
from aieng.engine.native.formats import FormatPlan, format_plan, plan_from_timings
from aieng.engine.native.llama import Dims, linear
from aieng.errors import ConfigError

pytestmark = pytest.mark.skipif(not packed_weights.supports(torch.float32), reason="no oneDNN packed linear here")
DTYPES = [
    torch.float32,
    pytest.param(
        torch.bfloat16,
        marks=pytest.mark.skipif(
            not packed_weights.supports(torch.bfloat16), reason="this CPU's oneDNN does not pack bf16"
        ),
    ),
]


@pytest.fixture
def weight():
    torch.manual_seed(0)
    w = torch.randn(48, 40) * 0.1
    yield w
    packed_weights.unpack(w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_product_matches_f_linear_from_min_rows_and_is_f_linear_below(weight, dtype):
    w = weight.to(dtype)
    packed_weights.pack(w)
    assert packed_weights.is_packed(w)
    x = torch.randn(9, 40).to(dtype)
    plain = F.linear(x, w).float()
    got = torch.ops.aieng.packed_linear(x, w, 8).float()
    assert got.shape == (9, 48)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got, plain, atol=tolerance, rtol=tolerance)
    below = torch.ops.aieng.packed_linear(x[:7], w, 8)  # fewer rows than min_rows: the plain kernel, bit for bit
    assert torch.equal(below, F.linear(x[:7], w))
    packed_weights.unpack(w)
    assert torch.equal(torch.ops.aieng.packed_linear(x, w, 8), F.linear(x, w))


def test_a_copy_goes_with_its_weight_and_a_new_tensor_at_the_address_never_meets_it():
    gc.collect()  # earlier tests' engines, and their copies, go first
    before = packed_weights.packed_bytes()
    w = torch.randn(64, 32)
    packed_weights.pack(w)
    assert packed_weights.packed_bytes() == before + 64 * 32 * 4
    del w
    gc.collect()
    assert packed_weights.packed_bytes() == before
    assert not packed_weights.is_packed(torch.empty(64, 32))  # whatever address it gets


@pytest.mark.parametrize("bad", [torch.zeros(4, 4, dtype=torch.int8), torch.zeros(2, 4, 4), torch.zeros(4)])
def test_only_2d_fp32_or_bf16_cpu_matrices_are_packed(bad):
    before = packed_weights.packed_bytes()
    with pytest.raises(ValueError, match="only 2-D fp32 or bf16 CPU weights"):
        packed_weights.pack(bad)
    assert packed_weights.packed_bytes() == before and not packed_weights.is_packed(bad)


def test_the_op_runs_inside_a_dynamic_compiled_graph(weight):
    packed_weights.pack(weight)

    def two_layers(x, w):
        dims = Dims(1, 1, 1, 1e-6, packed_from=4)
        return linear(torch.relu(linear(x, w, None, dims)[:, :40]), w, None, dims)

    compiled = torch.compile(two_layers, dynamic=True)
    for rows in (2, 5, 16):  # below and above min_rows, one graph
        x = torch.randn(rows, 40)
        assert torch.allclose(compiled(x, weight), two_layers(x, weight), atol=1e-5)


def test_the_plan_packs_from_where_packed_wins_at_every_larger_count():
    # seconds (fp32, bf16, packed fp32, packed bf16) by tokens
    timings = {1: (10, 6, 10, 7), 2: (10, 6, 9, 5), 8: (20, 30, 10, 25), 32: (40, 60, 20, 50)}
    plan = plan_from_timings(timings)
    # from 2 tokens the winner is packed at every count; bf16 wins at 1 and 2, fp32 (packed) from 8
    assert plan.packed_from == 2 and [plan.use_bf16(n) for n in (1, 2, 8, 32)] == [True, True, False, False]
    assert plan.formats_from(2) == {True, False} and plan.formats_from(8) == {False}
    assert plan.describe() == "bf16 from 1 token, fp32 from 8 tokens (oneDNN-packed from 2 tokens)"
    # a count where plain wins stops packing below it; without packed timings, nothing is packed
    assert plan_from_timings({**timings, 32: (40, 60, 41, 61)}).packed_from == 0
    assert plan_from_timings({n: t[:2] for n, t in timings.items()}).packed_from == 0
    # packing must win clearly (5%): it costs memory
    assert plan_from_timings({8: (10, 30, 9.6, 29)}).packed_from == 0


def test_a_second_format_must_save_half_a_millisecond_a_step():
    # the demo model's scale: bf16 and packed 2x faster, but 0.2 ms a step is not worth a format
    tiny = {1: (400e-6, 200e-6, 300e-6, 200e-6), 32: (800e-6, 600e-6, 700e-6, 450e-6)}
    assert plan_from_timings(tiny) == FormatPlan(((1, False), (32, False)), measured=True, packed_from=0)
    large = {n: tuple(t * 10 for t in times) for n, times in tiny.items()}  # 1.5-3.5 ms saved: taken
    assert plan_from_timings(large) == FormatPlan(((1, True), (32, True)), measured=True, packed_from=32)


def test_a_fixed_packed_format_needs_a_cpu_that_packs_it(demo, monkeypatch):
    model, _ = demo
    assert format_plan("float32-packed", model) == FormatPlan(packed_from=1)
    monkeypatch.setattr(packed_weights, "supports", lambda dtype: dtype == torch.float32)
    with pytest.raises(ConfigError, match="cannot pack bf16 weights.*use auto"):
        format_plan("bfloat16-packed", model)
    with pytest.raises(ValueError, match="use one of auto, float32, bfloat16, float32-packed, bfloat16-packed"):
        format_plan("fp8", model)


@pytest.mark.parametrize("formats", ["float32-packed", pytest.param("bfloat16-packed", marks=DTYPES[1].marks)])
def test_greedy_tokens_are_unchanged_by_packing(demo, render, formats):
    model, tokenizer = demo
    prompts = [render(p) for p in ("reverse: apple stone river", "add: 27+58", "sort: river apple stone")] * 3
    params = SamplingParams(max_tokens=16, temperature=0)
    plain = Engine(model, tokenizer, config=EngineConfig(compile=False, weight_formats=formats.removesuffix("-packed")))
    packed = Engine(model, tokenizer, config=EngineConfig(compile=False, weight_formats=formats))
    assert packed.runner.net.dims.packed_from == 1
    assert all(
        packed_weights.is_packed(m) for w in packed.runner.net.weights(formats.startswith("b")) for m in w.matrices
    )
    assert [r.token_ids for r in packed.generate(prompts, params)] == [
        r.token_ids for r in plain.generate(prompts, params)
    ]
