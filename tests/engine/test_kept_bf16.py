"""A checkpoint stored in bf16 is served from its own bf16 matrices on the CPU (loading/device.py):
no fp32 copy unless the format plan runs a step size in fp32, activations still in fp32, and the
same tokens as the fp32-widened model running the same formats."""

import pytest
import torch

from aieng.engine import Engine, EngineConfig
from aieng.engine.params import SamplingParams
from aieng.loading import choose_dtype
from aieng.loading.device import compute_dtype
from aieng.loading.loader import LoadConfig, load_folder

CPU = torch.device("cpu")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["add: 2+3", "the quick brown fox"]


def test_auto_keeps_what_the_native_forward_serves_in_bf16():
    assert choose_dtype("auto", CPU, "bfloat16") == torch.bfloat16
    assert choose_dtype("auto", CPU, "float32") == torch.float32
    assert choose_dtype("auto", CPU, None) == torch.float32  # the transformers forward's models
    assert choose_dtype("float32", CPU, "bfloat16") == torch.float32  # asked for: widened
    assert compute_dtype(torch.bfloat16, CPU) == torch.float32


def test_a_bf16_checkpoint_loads_in_bf16_and_evaluation_widens_it(tiny_bf16_model_dir):
    loaded = load_folder(tiny_bf16_model_dir)
    assert loaded.dtype == torch.bfloat16 and compute_dtype(loaded.dtype, loaded.device) == torch.float32
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert LoadConfig().full_precision().dtype == "float32"
    assert LoadConfig(dtype="bfloat16").full_precision().dtype == "bfloat16"  # an explicit choice stands
    widened = load_folder(tiny_bf16_model_dir, LoadConfig().full_precision())
    assert {p.dtype for p in widened.model.parameters()} == {torch.float32}


def _engine(folder, dtype: str, formats: str) -> Engine:
    loaded = load_folder(folder, LoadConfig(dtype=dtype))
    return Engine(loaded.model, loaded.tokenizer, config=EngineConfig(compile=False, weight_formats=formats))


def _tokens(engine: Engine) -> list[tuple[int, ...]]:
    return [tuple(r.token_ids) for r in engine.generate(PROMPTS, GREEDY)]


def test_a_plan_all_in_bf16_reads_the_models_own_matrices(tiny_bf16_model_dir):
    kept = _engine(tiny_bf16_model_dir, "auto", "bfloat16")
    net, model = kept.runner.net, kept.model
    assert net.kept_bf16 and net.layers is net.layers_bf16 and not net.both_formats
    layer = model.model.layers[0]
    assert net.layers[0].qkv.dtype == torch.bfloat16
    assert net.layers[0].qkv.data_ptr() == layer.self_attn.q_proj.weight.data_ptr()  # fused in place, no copy
    assert net.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    assert net.layers[0].norm_attn.dtype == net.final_norm.dtype == net.dtype == torch.float32
    assert kept.runner.cache.shape.dtype == torch.bfloat16  # auto's cache, as for fp32 weights run in bf16
    widened = _engine(tiny_bf16_model_dir, "float32", "bfloat16")
    assert _tokens(kept) == _tokens(widened)


def test_a_plan_with_fp32_steps_widens_a_copy_and_keeps_the_bf16_one(tiny_bf16_model_dir):
    kept = _engine(tiny_bf16_model_dir, "auto", "float32")
    net = kept.runner.net
    assert net.both_formats and net.layers[0].qkv.dtype == net.lm_head.dtype == torch.float32
    assert net.layers_bf16[0].qkv.data_ptr() == kept.model.model.layers[0].self_attn.q_proj.weight.data_ptr()
    net.drop_bf16_copy()  # the model's own weights: nothing to give back
    assert net.layers_bf16 is not None
    widened = _engine(tiny_bf16_model_dir, "float32", "float32")
    assert _tokens(kept) == _tokens(widened)


@pytest.mark.parametrize("formats", ["auto", "int8"])
def test_measured_and_quantised_plans_run_on_kept_weights(tiny_bf16_model_dir, formats):
    from aieng.engine.native import kernels

    if formats == "int8" and kernels.load() is not None:
        pytest.skip("aieng's CPU kernels do not build here")
    kept = _engine(tiny_bf16_model_dir, "auto", formats)
    plan, net = kept.runner.formats, kept.runner.net
    assert plan.measured and net.kept_bf16
    assert net.both_formats == plan.uses_fp32  # an fp32 copy exactly when a step size runs in fp32
    assert all(len(t) == GREEDY.max_tokens for t in _tokens(kept))


def test_a_bf16_checkpoint_the_transformers_forward_serves_loads_in_fp32(tiny_shape_model_dir, tmp_path):
    """GPT-2 is served by transformers' forward, which computes in the dtype it loads in: ``auto``
    widens it on the CPU as before, and only the native forward's checkpoints stay in bf16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aieng.engine.serving_table import ROWS

    from .architectures import build_row_model

    tokenizer = AutoTokenizer.from_pretrained(tiny_shape_model_dir)
    gpt2 = next(row for row in ROWS if row.model_type == "gpt2")
    folder = build_row_model(gpt2, tmp_path / "fp32", tokenizer)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    loaded = load_folder(tmp_path / "bf16")
    assert loaded.dtype == torch.float32 and {p.dtype for p in loaded.model.parameters()} == {torch.float32}


def test_a_biased_bf16_checkpoint_keeps_its_biases_in_fp32(tiny_shape_model_dir, tmp_path):
    """Qwen2-style q/k/v biases (and o's, Llama's attention_bias) are widened with the norms: the
    one-row kernels take fp32 vectors, and the tokens match the fp32-widened model's in bf16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aieng.engine.serving_table import ROWS

    from .architectures import build_row_model

    tokenizer = AutoTokenizer.from_pretrained(tiny_shape_model_dir)
    row = next(r for r in ROWS if r.model_type == "qwen2" and r.kind == "native")
    folder = build_row_model(row, tmp_path / "fp32", tokenizer)
    AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    tokenizer.save_pretrained(tmp_path / "bf16")
    kept = _engine(tmp_path / "bf16", "auto", "bfloat16")
    net = kept.runner.net
    assert net.kept_bf16 and net.layers[0].qkv_bias is not None and net.layers[0].qkv_bias.dtype == torch.float32
    assert _tokens(kept) == _tokens(_engine(tmp_path / "bf16", "float32", "bfloat16"))
