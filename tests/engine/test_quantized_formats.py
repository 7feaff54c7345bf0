"""What the quantised weight formats (``int8``, ``int4``: ``engine/native/quantized.py``) share: a
copy of the layers and the output projection in the format's storage dtype that one-row steps read
(eagerly and in the compiled one-row graphs), the float formats for larger steps, and a plan that
takes the format only where it wins on this machine and says why when it does not."""

import logging

import pytest
import torch

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.native import formats
from aieng.engine.native.graphs import GraphShape

PROMPTS = ["reverse: stone", "sort: 3 1 2", "add: 12 30", "json: name=ada"]
# format -> (storage dtype, a one-row step's bytes at most this share of fp32's, logits tolerance)
STORED = {"int8": (torch.int8, 1 / 3, 0.05), "int4": (torch.uint8, 1 / 6, 0.1)}


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_one_row_steps_read_the_quantized_copy_and_larger_ones_the_floats(built, quantized_wins, qwen, fmt):
    model, tokenizer = qwen  # biases on q, k and v; hidden size 64
    dtype, share, tolerance = STORED[fmt]
    runner = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, weight_formats=fmt)).runner
    assert runner.quantized_rows == 1 and runner.formats.quantized_rows == 1 and runner.quantized_format == fmt
    layer = runner.net.layers_quantized[0]
    assert layer.qkv.dtype == dtype and layer.qkv_bias is not None and len(layer.scales) == 4
    assert runner.net.lm_head_quantized[0].dtype == dtype
    assert runner.net.weights(bf16=False, quantized=True) is runner.net.layers_quantized
    assert runner.one_row_step_bytes() < runner.net.step_bytes(bf16=False) * share  # fewer bytes, scales included
    described = runner.describe(EngineConfig(weight_formats=fmt)).weights
    assert f"{fmt} weights for steps of 1 token" in described and f"one-row steps in {fmt}" in described

    hidden = torch.randn(1, model.config.hidden_size)
    exact, rounded = runner.net.logits(hidden), runner.net.logits(hidden, quantized=True)
    assert rounded.shape == exact.shape and not torch.equal(exact, rounded)
    torch.testing.assert_close(rounded, exact, atol=tolerance, rtol=tolerance)
    many = torch.randn(8, model.config.hidden_size)  # more rows than the kernel streams: the float head
    torch.testing.assert_close(runner.net.logits(many, quantized=True), runner.net.logits(many))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_answers_stay_close_to_fp32_and_the_compiled_one_row_graph_reads_the_format(
    built, quantized_wins, demo, render, fmt
):
    model, tokenizer = demo
    prompts = [render(p) for p in PROMPTS]
    params = SamplingParams(max_tokens=12, temperature=0)
    fp32 = [
        o.text for o in Engine(model, tokenizer, config=EngineConfig.exact(compile=False)).generate(prompts, params)
    ]
    eager = Engine(model, tokenizer, config=EngineConfig.exact(compile=False, weight_formats=fmt))
    one_by_one = [eager.generate([p], params)[0].text for p in prompts]  # batch 1: every decode step reads it
    assert sum(a == b for a, b in zip(fp32, one_by_one)) >= 3  # the demo's answers survive the rounding

    compiled = Engine(model, tokenizer, config=EngineConfig.exact(compile=True, weight_formats=fmt))
    compiled.warmup()
    shape = GraphShape(1, 0, False, fmt)
    assert shape in compiled.runner.graph_shapes and compiled.runner.net.one_row is not None  # one call a step
    again = [compiled.generate([p], params)[0].text for p in prompts]
    assert compiled.runner.steps_by_graph[shape] > 0
    assert sum(a == b for a, b in zip(one_by_one, again)) >= 3  # the same arithmetic, compiled or not


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_the_plan_refuses_the_format_where_it_does_not_win_and_says_so(built, monkeypatch, qwen, caplog, fmt):
    model, _ = qwen
    monkeypatch.setattr(formats, "quantized_wins", lambda float_s, quantized_s: False)
    with caplog.at_level(logging.INFO, logger="aieng.engine"):
        plan = formats.format_plan(fmt, model)
    assert plan.quantized_rows == 0 and fmt not in plan.describe()
    said = [r.getMessage() for r in caplog.records if f"{fmt} weights" in r.getMessage()]
    assert said and "refused: not clearly faster than the float formats here" in said[0]
    assert "fp32" in said[0] and "bf16" in said[0] and f"{fmt} " in said[0] and " ms" in said[0]
