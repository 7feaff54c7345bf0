"""The ``int4`` weight format (``engine/native/int4_weights.py``): 4-bit groups of 32 packed two a
byte in the layout the kernel unpacks, the step's input rounded to int8 per group exactly as
``matvec_int4`` rounds it, and rows the kernel cannot take refused (what every quantised format
shares: ``test_quantized_formats.py``)."""

import pytest
import torch
import torch.nn.functional as F

from aieng.engine.native import formats, int4_weights
from aieng.engine.native.llama import Dims, linear
from aieng.errors import ConfigError


def test_a_quantized_row_uses_all_sixteen_levels_and_stands_for_the_weights_within_a_step():
    torch.manual_seed(0)
    matrix = torch.randn(40, 192) * torch.linspace(0.01, 3, 192)  # groups of very different ranges
    matrix[3, :32] = 0  # an all-zero group
    packed, scales = int4_weights.quantize(matrix)
    assert packed.dtype == torch.uint8 and packed.shape == (40, 96) and scales.shape == (40, 6)
    levels = torch.stack((packed & 15, packed >> 4)).flatten().unique()
    assert levels.tolist() == list(range(16))  # -8..7 stored as 0..15: the extreme maps to -8
    restored = int4_weights.dequantize(packed, scales)
    error = (restored - matrix).abs().reshape(40, 6, 32)
    step = scales.abs()[..., None]
    # within half a step, except where a value on the other side from the extreme rounds past +7
    assert bool((error <= step + 1e-6).all()) and float((error <= step / 2 + 1e-6).float().mean()) > 0.99
    assert bool((restored[3, :32] == 0).all()) and float(scales[3, 0]) == 0.0


def test_the_layout_is_the_kernels_low_nibbles_then_high_nibbles_of_each_64():
    """Byte j of a 32-byte chunk: weight j in the low nibble, weight 32 + j in the high one."""
    matrix = torch.zeros(1, 64)
    matrix[0, 0], matrix[0, 5], matrix[0, 32 + 5] = -8.0, 3.0, -4.0  # group 0's scale is 1
    matrix[0, 63] = 8.0  # group 1: the extreme is +8, so the scale is -1 and +8 is stored as -8
    packed, scales = int4_weights.quantize(matrix)
    assert scales.tolist() == [[1.0, -1.0]]
    assert int(packed[0, 0]) == 0 + (8 << 4)  # weight 0 = -8 -> 0; weight 32 = 0 -> 8
    assert int(packed[0, 5]) == 11 + (12 << 4)  # weight 5 = 3 -> 11; weight 37 = -4 / -1 = 4 -> 12
    assert int(packed[0, 31]) >> 4 == 0  # weight 63 = 8 / -1 = -8 -> 0
    torch.testing.assert_close(int4_weights.dequantize(packed, scales), matrix)


def test_a_row_the_kernel_cannot_take_is_refused():
    assert not int4_weights.fits(torch.zeros(4, 96)) and int4_weights.fits(torch.zeros(4, 128))
    with pytest.raises(ValueError, match="not a multiple of 64"):
        int4_weights.quantize(torch.randn(4, 96))


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(96, 128), (7, 64), (1152, 896)])
def test_an_int4_linear_is_the_product_of_the_rounded_input_and_weights_plus_the_bias(built, rows, n, k):
    torch.manual_seed(rows * n)
    weight, bias, x = torch.randn(n, k), torch.randn(n), torch.randn(rows, k)
    x[0, :32] = 0  # an all-zero input group
    packed, scales = int4_weights.quantize(weight)
    out = linear(x, packed, bias, Dims(4, 2, 32, 1e-6, matvec_kernel=True), scales)
    expected = F.linear(int4_weights.round_input(x), int4_weights.dequantize(packed, scales), bias)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    exact = F.linear(x, weight, bias)  # and usable: close to the unrounded product
    assert (out - exact).abs().max() < 0.15 * exact.abs().max()


def test_the_kernel_refuses_what_it_cannot_take_with_a_message(built):
    op, packed, scales = torch.ops.aieng.matvec_int4, torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 2)
    with pytest.raises(RuntimeError, match="1 to 4 rows"):
        op(torch.randn(5, 64), packed, scales)
    with pytest.raises(RuntimeError, match="multiple of 64"):
        op(torch.randn(1, 32), torch.zeros(8, 16, dtype=torch.uint8), torch.ones(8, 1))
    with pytest.raises(RuntimeError, match="x has 128 columns, weight 64"):
        op(torch.randn(1, 128), packed, torch.ones(8, 4))
    with pytest.raises(RuntimeError, match="uint8"):
        op(torch.randn(1, 64), packed.to(torch.int8), scales)
    with pytest.raises(RuntimeError, match=r"scales \[N, K / 32\]"):
        op(torch.randn(1, 64), packed, torch.ones(8, 1))


def test_int4_on_rows_the_kernel_cannot_take_is_a_configuration_error():
    from transformers import LlamaConfig, LlamaForCausalLM

    odd = LlamaForCausalLM(
        LlamaConfig(vocab_size=64, hidden_size=96, intermediate_size=192, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(ConfigError, match="'int4': not on this host .*multiple of 64 weights.*use auto"):
        formats.format_plan("int4", odd.eval())
