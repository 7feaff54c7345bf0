"""The ``int8`` weight format (``engine/native/int8_weights.py``): group-quantised rows that stand
for the weights within half a step, the kernel's product with them, and the plan's bar for a
quantised format (what every quantised format shares: ``test_quantized_formats.py``)."""

import pytest
import torch
import torch.nn.functional as F

from aieng.engine.native import formats, int8_weights, kernels
from aieng.engine.native.llama import Dims, linear
from aieng.errors import ConfigError


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


def test_the_bar_for_int8_is_the_bar_for_bf16():
    assert formats.quantized_wins(0.010, 0.005) and not formats.quantized_wins(0.010, 0.0097)
    assert not formats.quantized_wins(0.0008, 0.0004)  # faster, but saves less than the plan's minimum a step


def test_int8_where_it_cannot_run_is_a_configuration_error(monkeypatch, qwen):
    model, _ = qwen
    monkeypatch.setattr(kernels, "load", lambda: "RuntimeError: no C++ compiler (set CXX, or install g++)")
    with pytest.raises(ConfigError, match="not on this host .*no C\\+\\+ compiler.*use auto"):
        formats.format_plan("int8", model)
