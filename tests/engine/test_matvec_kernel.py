"""aieng's CPU matrix-vector kernel (``kernels/matvec.cpp``): the same products as ``F.linear`` for
every shape the native forward gives it (1-4 rows, bands with a remainder, bf16 pairs and the
plain path), int8 with group scales, clear refusals, and use inside the one-row compiled graph."""

import pytest
import torch
import torch.nn.functional as F

from aieng.engine.native import kernels, packed_weights
from aieng.engine.native.llama import Dims, few_rows, linear, one_row_logits, rms_norm


@pytest.fixture(scope="module")
def matvec():
    reason = kernels.load()
    assert reason is None, reason  # this machine has the compiler torch.compile needs
    return torch.ops.aieng.matvec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 33])  # from 5 rows: at::linear inside the op
@pytest.mark.parametrize(("n", "k"), [(64, 32), (67, 48), (5, 896), (1152, 896), (3, 16)])
def test_the_kernel_matches_f_linear(matvec, dtype, rows, n, k):
    torch.manual_seed(n * k + rows)
    x, weight = torch.randn(rows, k), torch.randn(n, k).to(dtype)
    out = matvec(x, weight)
    assert out.dtype == torch.float32 and out.shape == (rows, n)
    if rows <= kernels.MATVEC_MAX_ROWS:  # bf16 weights widened, the input not rounded: the fp32 product
        torch.testing.assert_close(out, F.linear(x, weight.float()), rtol=1e-4, atol=1e-4)
    else:  # a matrix product: what F.linear gives in the weight's dtype, as before the kernel
        torch.testing.assert_close(out, F.linear(x.to(dtype), weight).float())


def test_a_non_contiguous_input_is_taken_as_its_values(matvec):
    x, weight = torch.randn(32, 3).t(), torch.randn(40, 32).bfloat16()
    torch.testing.assert_close(matvec(x, weight), F.linear(x, weight.float()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [16, 64, 128])
def test_int8_with_group_scales_matches_the_dequantized_product(matvec, group):
    torch.manual_seed(group)
    n, k = 70, 256
    weight = torch.randn(n, k)
    grouped = weight.view(n, k // group, group)
    scales = grouped.abs().amax(-1) / 127
    quantized = torch.round(grouped / scales[..., None]).clamp(-127, 127).to(torch.int8).view(n, k)
    dequantized = (quantized.view(n, k // group, group).float() * scales[..., None]).view(n, k)
    x = torch.randn(2, k)
    out = torch.ops.aieng.matvec_int8(x, quantized, scales.contiguous())
    torch.testing.assert_close(out, F.linear(x, dequantized), rtol=1e-4, atol=1e-4)
    # and close to the unquantized product: the format is usable, not only self-consistent
    assert (out - F.linear(x, weight)).abs().max() < 0.05 * F.linear(x, weight).abs().max()


def test_the_kernel_refuses_what_it_cannot_take_with_a_message(matvec):
    weight = torch.randn(8, 32)
    with pytest.raises(RuntimeError, match="at least one row"):
        matvec(torch.randn(0, 32), weight)
    with pytest.raises(RuntimeError, match="1 to 4 rows"):
        torch.ops.aieng.matvec_int8(torch.randn(5, 32), torch.zeros(8, 32, dtype=torch.int8), torch.ones(8, 1))
    with pytest.raises(RuntimeError, match="multiple of"):
        matvec(torch.randn(1, 24), torch.randn(8, 24))
    with pytest.raises(RuntimeError, match="columns"):
        matvec(torch.randn(1, 16), weight)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        matvec(torch.randn(1, 32), weight.half())
    with pytest.raises(RuntimeError, match="x must be float32"):
        matvec(torch.randn(1, 32).double(), weight)
    with pytest.raises(RuntimeError, match="contiguous"):
        matvec(torch.randn(1, 32), torch.randn(32, 16).t())
    with pytest.raises(RuntimeError, match="group of weights per scale"):
        torch.ops.aieng.matvec_int8(torch.randn(1, 32), torch.zeros(8, 32, dtype=torch.int8), torch.ones(8, 3))
    with pytest.raises(RuntimeError, match=r"scales \[N, K / group\]"):
        torch.ops.aieng.matvec_int8(torch.randn(1, 32), torch.zeros(8, 32, dtype=torch.int8), torch.ones(7, 2))


def test_matvec_fits_only_what_the_kernel_takes():
    assert kernels.matvec_fits(torch.zeros(4, 32)) and kernels.matvec_fits(torch.zeros(4, 32, dtype=torch.bfloat16))
    assert not kernels.matvec_fits(torch.zeros(4, 24))  # a row not a whole number of vectors
    assert not kernels.matvec_fits(torch.zeros(4, 32, dtype=torch.float16))
    assert not kernels.matvec_fits(torch.zeros(32, 4).t())


def test_few_rows_is_up_to_four_eagerly():
    assert [few_rows(torch.zeros(r, 8)) for r in (1, 2, 4, 5, 64)] == [True, True, True, False, False]


def test_an_eager_step_keeps_its_kernels_while_graphs_compile_on_another_thread():
    """Dynamo holds a process-wide "compiling" flag up for a whole compile session (the background
    compile's); an eager step on the engine thread meanwhile is not inside any trace."""
    with torch.compiler._compile_session_context():
        assert torch.compiler.is_compiling()  # the flag the choice must not read
        assert [few_rows(torch.zeros(r, 8)) for r in (1, 2, 4, 5)] == [True, True, True, False]


def test_the_one_row_graph_and_the_head_run_through_the_kernel(matvec, monkeypatch):
    """The compiled one-row layer and output projection call the kernel (counted by wrapping the
    op the graph calls), and give F.linear's result; without the flag they never call it."""
    calls = []
    real = torch.ops.aieng.matvec

    class Counting:
        def __call__(self, *args):
            calls.append(args[1].shape)
            return real(*args)

    monkeypatch.setattr(torch.ops.aieng, "matvec", Counting())
    weight, norm = torch.randn(48, 32).bfloat16(), torch.ones(32)
    x = torch.randn(1, 32)
    with_kernel, without = Dims(1, 1, 32, 1e-6, matvec_kernel=True), Dims(1, 1, 32, 1e-6)
    torch.testing.assert_close(linear(x, weight, None, with_kernel), F.linear(x, weight.float()), rtol=1e-4, atol=1e-4)
    assert calls == [weight.shape]
    linear(x, weight, None, without)
    assert len(calls) == 1
    packed = Dims(1, 1, 32, 1e-6, packed_from=8, matvec_kernel=True)
    assert not packed_weights.is_packed(weight)  # below packed_from (or unpacked) packed_linear is F.linear
    linear(torch.randn(5, 32), weight, None, packed)  # more rows than the kernel streams, packed copies on
    assert len(calls) == 1
    linear(torch.randn(5, 32), weight, None, with_kernel)  # no packed copies: the op decides per call
    assert len(calls) == 2
    logits = one_row_logits(x, norm, 1e-6, weight, True)
    torch.testing.assert_close(logits, F.linear(rms_norm(x, norm, 1e-6), weight.float()), rtol=1e-4, atol=1e-4)
    assert len(calls) == 3
    monkeypatch.undo()
    compiled = torch.compile(lambda x, w: linear(x, w, None, with_kernel) + 1, fullgraph=True, dynamic=False)
    torch.testing.assert_close(compiled(x, weight), F.linear(x, weight.float()) + 1, rtol=1e-4, atol=1e-4)
    # a graph whose row count varies (dynamic): 2, 3 and 40 rows, each as F.linear gives it
    dynamic = torch.compile(lambda x, w: linear(x, w, None, with_kernel) * 2, fullgraph=True, dynamic=True)
    for rows in (2, 3, 40):  # 40 rows: a bf16 matrix product, the input rounded as F.linear rounds it
        x = torch.randn(rows, 32)
        expected = F.linear(x, weight.float()) if rows <= 4 else F.linear(x.bfloat16(), weight).float()
        torch.testing.assert_close(dynamic(x, weight), expected * 2, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [0, 7, 64, 1000, 100_003])
def test_stream_read_sums_the_whole_buffer(matvec, size):
    buffer = torch.rand(size)
    assert torch.ops.aieng.stream_read(buffer) == pytest.approx(float(buffer.double().sum()), rel=1e-5, abs=1e-5)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        torch.ops.aieng.stream_read(torch.ones(8, dtype=torch.float64))
