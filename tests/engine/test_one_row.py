"""The batch-1 decode step in one call (``engine/native/one_row.py``, ``kernels/one_row.cpp``): the
same hidden state and the same cache writes as the decoder layers it replaces, in every weight
format and cache dtype, on architectures with and without biases; a bad call changes nothing."""

import gc
import weakref

import pytest
import torch

from aieng.engine import Engine, EngineConfig, SamplingParams
from aieng.engine.native import one_row
from aieng.engine.native.llama import AttentionPlan, causal_decode_mask
from aieng.engine.native.model import NativeLlama
from aieng.engine.native.slots import SlotKVCache, SlotShape

SLOT, POSITION = 1, 9  # not the first slot, a position with history to attend


@pytest.fixture(scope="module")
def llama_biased(demo):
    """A random Llama with every projection biased (attention_bias, mlp_bias) and grouped queries."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        attention_bias=True,
        mlp_bias=True,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def native(model, quantized: str = "") -> NativeLlama:
    return NativeLlama(
        model, bf16_copy=True, compile_layers=False, decode_kernel=True, matvec_kernel=True, quantized_copy=quantized
    )


def history_cache(net: NativeLlama, dtype: torch.dtype) -> SlotKVCache:
    """Two slots whose first POSITION entries hold random keys and values (past tokens)."""
    shape = SlotShape(net.num_layers, net.dims.kv_heads, net.dims.head_dim, dtype)
    cache = SlotKVCache(shape, slots=2, capacity=32, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(2)
    with torch.inference_mode():  # the cache's tensors are inference tensors, as in serving
        for layer in cache.keys + cache.values:
            layer[:, :, :POSITION] = torch.randn(layer[:, :, :POSITION].shape, generator=generator).to(dtype)
    return cache


def one_step(net: NativeLlama, cache: SlotKVCache, *, fused: bool, bf16: bool, quantized: bool) -> torch.Tensor:
    pos = torch.tensor([POSITION])
    plan = AttentionPlan(1, SLOT, pos, causal_decode_mask(pos, POSITION + 1), None, None, None, None)
    kept = net.one_row
    net.one_row = kept if fused else None
    try:
        with torch.inference_mode():
            token = torch.tensor([5])
            return net.hidden(plan, cache, token, None, None, bf16=bf16, quantized=quantized, compiled=False)
    finally:
        net.one_row = kept


@pytest.mark.parametrize("arch", ["qwen", "llama_biased"])
@pytest.mark.parametrize("weights", ["float32", "bfloat16", "int8", "int4"])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_one_call_computes_what_the_decoder_layers_compute(built, request, arch, weights, cache_dtype):
    fixture = request.getfixturevalue(arch)
    model = fixture[0] if isinstance(fixture, tuple) else fixture
    net = native(model, weights if weights.startswith("int") else "")
    assert net.one_row is not None  # every copy (fp32, bf16, the quantised one) fits the op
    step = dict(bf16=weights == "bfloat16", quantized=weights.startswith("int"))
    plain_cache, fused_cache = history_cache(net, cache_dtype), history_cache(net, cache_dtype)
    want = one_step(net, plain_cache, fused=False, **step)
    got = one_step(net, fused_cache, fused=True, **step)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(fused_cache.keys + fused_cache.values, plain_cache.keys + plain_cache.values):
        assert mine[SLOT, :, POSITION].abs().sum() > 0  # this layer's key and value were written ...
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)  # ... as the layers write them, alone


def test_a_bad_call_is_refused_whole_and_writes_no_cache(built, qwen):
    net = native(qwen[0])
    cache = history_cache(net, torch.float32)
    before = [t.clone() for t in cache.keys + cache.values]
    x, cos = torch.randn(1, net.dims.heads * net.dims.head_dim), torch.ones(net.dims.head_dim)
    tensors = [t for w in net.layers for t in w.tensors()]
    broken, down = list(tensors), len(tensors) - 14 + 6  # the last layer's down matrix, cut short
    broken[down] = broken[down][:, :32].contiguous()
    dims = (net.dims.heads, net.dims.kv_heads, net.dims.head_dim, net.dims.eps)
    cases = {
        "takes": (x, broken, POSITION),  # found only at the last layer: the first ones must not have run
        "do not hold slot": (x, tensors, 32 + 1),  # past the cache's capacity
        "14 tensors": (x, tensors[:-1], POSITION),
        r"x is \[1, D\] float32": (x.double(), tensors, POSITION),
    }
    for message, (row, layers, position) in cases.items():
        with pytest.raises(RuntimeError, match=message), torch.inference_mode():
            torch.ops.aieng.one_row_layers(row, cos, cos, position, SLOT, layers, cache.keys, cache.values, *dims)
    assert all(torch.equal(a, b) for a, b in zip(before, cache.keys + cache.values))


def test_layers_it_cannot_compute_exactly_keep_the_decoder_layers(built, qwen):
    model = qwen[0]
    net = native(model)
    assert one_row.fits(net.layers, net.dims, torch.float32)
    assert not one_row.fits(net.layers, net.dims, torch.bfloat16)  # bf16 activations: not the op's arithmetic
    bf16_norms = [type(w)(**{**vars(w), "norm_attn": w.norm_attn.bfloat16()}) for w in net.layers]
    assert not one_row.fits(bf16_norms, net.dims, torch.float32)
    without_kernel = NativeLlama(model, bf16_copy=False, compile_layers=False, decode_kernel=False, matvec_kernel=True)
    assert without_kernel.one_row is None  # PyTorch's attention chosen: the whole step stays on its path


def test_batch_1_answers_are_the_decoder_layers_answers(built, demo, render):
    """Greedy, one request at a time: every decode step goes through the op; answers as before."""
    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=False))
    assert engine.runner.net.one_row is not None
    prompts = [render(p) for p in ("reverse: stone", "sort: 3 1 2", "add: 12 30")]
    params = SamplingParams(max_tokens=16, temperature=0)
    fused = [engine.generate([p], params)[0].token_ids for p in prompts]
    engine.runner.net.one_row = None
    plain = [engine.generate([p], params)[0].token_ids for p in prompts]
    assert fused == plain


def test_a_dropped_bf16_copy_frees_its_memory_after_the_op_has_run_on_it(built, qwen):
    net = native(qwen[0])
    one_step(net, history_cache(net, torch.float32), fused=True, bf16=True, quantized=False)  # the op keeps a view
    copy = weakref.ref(net.layers_bf16[0].qkv)
    net.drop_bf16_copy()
    gc.collect()
    assert net.layers_bf16 is None and net.lm_head_bf16 is None and copy() is None
