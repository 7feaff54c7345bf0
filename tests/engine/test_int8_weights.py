"""The ``int8`` weight format (``engine/native/int8_weights.py``): group-quantised rows that stand
for the weights within half a step, the one-row steps (layers and output projection) reading
them through ``matvec_int8``, larger steps in the float formats, and a plan that takes int8 only
where it wins on this machine and says why when it does not."""

import logging

import pytest
import torch
import torch.nn.functional as F

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.native import formats, int8_weights, kernels
from aieng.engine.native.graphs import GraphShape
from aieng.engine.native.llama import Dims, linear
from aieng.errors import ConfigError

PROMPTS = ["reverse: stone", "sort: 3 1 2", "add: 12 30", "json: name=ada"]


@pytest.fixture(scope="module")
def built():
    reason = kernels.load()
    assert reason is None, reason  # this machine has the compiler torch.compile needs


@pytest.fixture
def int8_wins(monkeypatch):
    """int8 taken whatever the race says: on models this small no format saves the plan's bar."""
    monkeypatch.setattr(formats, "int8_wins", lambda float_s, int8_s: True)


@pytest.mark.parametrize(("columns", "group"), [(896, 128), (576, 64), (4864, 128), (1536, 128), (48, 16), (24, None)])
def test_the_group_is_the_largest_the_kernel_takes_that_divides_a_row(columns, group):
    assert int8_weights.group_size(columns) == group


def test_a_quantized_row_stands_for_the_weights_within_half_a_step():
    torch.manual_seed(0)
    matrix = torch.randn(40, 192) * torch.linspace(0.01, 3, 192)  # groups of very different ranges
    matrix[3, :64] = 0  # an all-zero group
    q, scales = int8_weights.quantize(matrix)
    assert q.dtype == torch.int8 and q.shape == matrix.shape and scales.shape == (40, 3)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    error = (int8_weights.dequantize(q, scales) - matrix).abs().reshape(40, 3, 64)
    assert bool((error <= scales[..., None] / 2 + 1e-6).all())
    assert bool((q[3, :64] == 0).all()) and float(scales[3, 0]) == 0.0


def test_a_row_the_kernel_cannot_take_is_refused():
    with pytest.raises(ValueError, match="not a multiple of 16"):
        int8_weights.quantize(torch.randn(4, 24))


@pytest.mark.parametrize("rows", [1, 2, 4])
def test_an_int8_linear_is_the_product_with_the_dequantized_weights_plus_the_bias(built, rows):
    torch.manual_seed(rows)
    weight, bias, x = torch.randn(96, 128), torch.randn(96), torch.randn(rows, 128)
    q, scales = int8_weights.quantize(weight)
    out = linear(x, q, bias, Dims(4, 2, 32, 1e-6, matvec_kernel=True), scales)
    torch.testing.assert_close(out, F.linear(x, int8_weights.dequantize(q, scales), bias), rtol=1e-4, atol=1e-4)


def test_the_int8_format_reads_int8_at_one_row_and_floats_above(built, int8_wins, qwen, render):
    model, tokenizer = qwen  # biases on q, k and v
    runner = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, weight_formats="int8")).runner
    assert runner.int8_rows == 1 and runner.formats.int8_rows == 1
    layer = runner.net.layers_int8[0]
    assert layer.qkv.dtype == torch.int8 and layer.qkv_bias is not None and len(layer.scales) == 4
    assert runner.net.lm_head_int8[0].dtype == torch.int8
    assert runner.net.weights(bf16=False, int8=True) is runner.net.layers_int8
    fp32_bytes = runner.net.step_bytes(bf16=False)
    assert runner.one_row_step_bytes() < fp32_bytes / 3  # a quarter of the bytes, and the scales
    described = runner.describe(EngineConfig(weight_formats="int8")).weights
    assert "int8 weights for steps of 1 token" in described and "one-row steps in int8" in described

    hidden = torch.randn(1, model.config.hidden_size)
    exact, rounded = runner.net.logits(hidden), runner.net.logits(hidden, int8=True)
    assert rounded.shape == exact.shape and not torch.equal(exact, rounded)
    torch.testing.assert_close(rounded, exact, atol=0.05, rtol=0.05)
    many = torch.randn(8, model.config.hidden_size)  # more rows than the kernel streams: the float head
    torch.testing.assert_close(runner.net.logits(many, int8=True), runner.net.logits(many))


def test_int8_answers_stay_close_to_fp32_and_the_compiled_one_row_graph_reads_int8(built, int8_wins, demo, render):
    model, tokenizer = demo
    prompts = [render(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=12, temperature=0)
    fp32 = [
        o.text for o in Engine(model, tokenizer, config=EngineConfig.exact(compile=False)).generate(prompts, params)
    ]
    eager = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, weight_formats="int8"))
    one_by_one = [eager.generate([p], params)[0].text for p in prompts]  # batch 1: every decode step reads int8
    assert sum(a == b for a, b in zip(fp32, one_by_one)) >= 3  # the demo's answers survive int8

    compiled = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, weight_formats="int8"))
    compiled.warmup()
    assert GraphShape(1, 0, False, True) in compiled.runner.graph_shapes
    assert compiled.runner.net.head_ready
    again = [compiled.generate([p], params)[0].text for p in prompts]
    assert compiled.runner.steps_by_graph[GraphShape(1, 0, False, True)] > 0
    assert sum(a == b for a, b in zip(one_by_one, again)) >= 3


def test_the_plan_refuses_int8_where_it_does_not_win_and_says_so(built, monkeypatch, qwen, caplog):
    model, _ = qwen
    monkeypatch.setattr(formats, "int8_wins", lambda float_s, int8_s: False)
    with caplog.at_level(logging.INFO, logger="aieng.engine"):
        plan = formats.format_plan("int8", model)
    assert plan.int8_rows == 0 and "int8" not in plan.describe()
    said = [r.getMessage() for r in caplog.records if "int8 weights" in r.getMessage()]
    assert said and "refused: not clearly faster than the float formats here" in said[0]
    assert "fp32" in said[0] and "bf16" in said[0] and " ms" in said[0]


def test_the_bar_for_int8_is_the_bar_for_bf16():
    assert formats.int8_wins(0.010, 0.005) and not formats.int8_wins(0.010, 0.0097)
    assert not formats.int8_wins(0.0008, 0.0004)  # faster, but saves less than the plan's minimum a step


def test_int8_where_it_cannot_run_is_a_configuration_error(monkeypatch, qwen):
    model, _ = qwen
    monkeypatch.setattr(kernels, "load", lambda: "RuntimeError: no C++ compiler (set CXX, or install g++)")
    with pytest.raises(ConfigError, match="not on this host .*no C\\+\\+ compiler.*use auto"):
        formats.format_plan("int8", model)
