"""aieng's CPU decode-attention kernel: the same attention as PyTorch's, for every layout the engine
gives it, clear errors for what it cannot take, and a clean fall-back where it cannot be built."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from aieng.engine.native import kernels


@pytest.fixture(scope="module")
def decode_attention():
    reason = kernels.load()
    assert reason is None, reason  # this machine has the compiler torch.compile needs
    return torch.ops.aieng.decode_attention


def reference(query, keys, values, positions, first):
    """SDPA over each row's keys 0..position, in float32."""
    rows = query.shape[0]
    span = int(positions.max()) + 1
    mask = (torch.arange(span)[None, :] <= positions[:, None])[:, None, None, :]
    k = keys[first : first + rows, :, :span].float()
    v = values[first : first + rows, :, :span].float()
    return F.scaled_dot_product_attention(query, k, v, attn_mask=mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("kv_heads", "groups", "head_dim"), [(3, 3, 64), (2, 1, 16), (1, 9, 32), (4, 2, 128)])
def test_the_kernel_matches_sdpa_for_rows_of_different_lengths(decode_attention, dtype, kv_heads, groups, head_dim):
    torch.manual_seed(kv_heads * 100 + groups)
    slots, capacity = 6, 700
    keys = torch.randn(slots, kv_heads, capacity + 1, head_dim).to(dtype)
    values = torch.randn(slots, kv_heads, capacity + 1, head_dim).to(dtype)
    query = torch.randn(4, kv_heads, groups, head_dim)
    positions = torch.tensor([0, 5, 699, 130])  # one key only, short, the whole capacity, between
    for first in (0, 2):
        out = decode_attention(query, keys, values, positions, first, head_dim**-0.5)
        assert out.shape == query.shape and out.dtype == torch.float32
        torch.testing.assert_close(out, reference(query, keys, values, positions, first), atol=2e-5, rtol=1e-4)


def test_the_kernel_reads_only_the_keys_each_row_may_attend(decode_attention):
    """What lies past a row's position (another request's leftovers, NaN) never reaches its output."""
    keys, values = torch.randn(2, 1, 65, 16), torch.randn(2, 1, 65, 16)
    keys[:, :, 11:], values[:, :, 11:] = float("nan"), float("nan")
    query = torch.randn(2, 1, 2, 16)
    out = decode_attention(query, keys, values, torch.tensor([10, 3]), 0, 0.25)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, reference(query, keys[:, :, :11], values[:, :, :11], torch.tensor([10, 3]), 0))


def test_the_kernel_refuses_what_it_cannot_take_with_a_message(decode_attention):
    keys, values = torch.randn(2, 1, 9, 16), torch.randn(2, 1, 9, 16)
    query = torch.randn(1, 1, 2, 16)
    with pytest.raises(RuntimeError, match="position lies outside the cache"):
        decode_attention(query, keys, values, torch.tensor([9]), 0, 0.25)
    with pytest.raises(RuntimeError, match="within the cache"):
        decode_attention(query, keys, values, torch.tensor([1]), 2, 0.25)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        decode_attention(query, keys.half(), values.half(), torch.tensor([1]), 0, 0.25)
    with pytest.raises(RuntimeError, match="head width"):
        decode_attention(
            torch.randn(1, 1, 2, 12), torch.randn(2, 1, 9, 12), torch.randn(2, 1, 9, 12), torch.tensor([1]), 0, 0.25
        )


def test_the_kernel_runs_inside_a_compiled_graph(decode_attention):
    keys, values = torch.randn(3, 2, 50, 32), torch.randn(3, 2, 50, 32)
    query, positions = torch.randn(2, 2, 2, 32), torch.tensor([7, 40])

    def step(q, k, v, p):
        return decode_attention(q * 2, k, v, p, 1, 32**-0.5) + 1

    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(compiled(query, keys, values, positions), step(query, keys, values, positions))


def test_the_library_is_built_once_and_named_by_source_flags_and_compiler(decode_attention):
    cxx = kernels.compiler()
    built = kernels.library_path(cxx)
    assert built.exists() and built.parent == kernels.cache_dir()
    assert kernels.library_path(cxx) == built  # the same inputs, the same file: a restart loads it
    assert not list(built.parent.glob("*.tmp"))  # no half-written library left behind


def test_the_library_name_follows_the_sources_content_not_where_they_lie(tmp_path, monkeypatch):
    """A second checkout, virtual environment or install of the same aieng and torch loads the
    kernels the first one built."""
    from torch.utils import cpp_extension

    cxx = kernels.compiler()
    here = kernels.library_path(cxx)
    copies = []
    for source in kernels.SOURCES + kernels.HEADERS:
        copy = tmp_path / "elsewhere" / source.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_bytes(source.read_bytes())
        copies.append(copy)
    monkeypatch.setattr(kernels, "SOURCES", tuple(copies[: len(kernels.SOURCES)]))
    monkeypatch.setattr(kernels, "HEADERS", tuple(copies[len(kernels.SOURCES) :]))
    assert kernels.library_path(cxx) == here
    torch_dir, other_venv = str(Path(torch.__file__).parent), str(tmp_path / "venv" / "torch")
    for name in ("include_paths", "library_paths"):
        found = getattr(cpp_extension, name)()
        monkeypatch.setattr(
            cpp_extension, name, lambda *a, found=found, **k: [p.replace(torch_dir, other_venv) for p in found]
        )
    monkeypatch.setattr(torch, "__file__", other_venv + "/__init__.py")
    assert kernels.library_path(cxx) == here
    copies[-1].write_text(copies[-1].read_text() + "\n// changed\n")  # a header: the kernels the sources include
    assert kernels.library_path(cxx) != here


def test_without_a_compiler_the_engine_serves_with_pytorch_attention(demo, monkeypatch, caplog):
    """A host that cannot build the kernel logs why once and serves the same tokens with SDPA."""
    model, tokenizer = demo
    monkeypatch.setattr(kernels, "_state", {"loaded": False, "error": None})
    monkeypatch.setattr(kernels, "compiler", lambda: None)
    with caplog.at_level("WARNING", logger="aieng.engine"):
        fallback = Engine(model, tokenizer, config=EngineConfig(compile=False))
    assert not fallback.runner.net.dims.decode_kernel
    assert "no C++ compiler" in caplog.text and "using PyTorch's attention" in caplog.text
    monkeypatch.undo()
    with_kernel = Engine(model, tokenizer, config=EngineConfig(compile=False))
    assert with_kernel.runner.net.dims.decode_kernel

    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = [with_kernel.encode(p) for p in ("reverse: apple stone river", "add: 27+58", "sort: zoo oak moon")]
    outputs = []
    for engine in (fallback, with_kernel):
        engine.prefill([GenerationRequest(f"r{i}", ids, params) for i, ids in enumerate(prompts)])
        produced: dict[str, list[int]] = {}
        while engine.num_running:
            for event in engine.decode():
                produced.setdefault(event.request_id, []).append(event.token_id)
        outputs.append(produced)
    assert outputs[0] == outputs[1]


def test_kv_cache_dtype_auto_is_bf16_only_where_the_one_row_step_streams_bf16_and_the_kernel_reads_it():
    from aieng.engine.native.slots import kv_dtype
    from aieng.errors import AiengError

    fp32 = torch.float32
    assert kv_dtype("auto", fp32, one_row_bf16=True, decode_kernel=True) == torch.bfloat16
    assert kv_dtype("auto", fp32, one_row_bf16=False, decode_kernel=True) == fp32  # compute-bound: stay exact
    assert kv_dtype("auto", fp32, one_row_bf16=True, decode_kernel=False) == fp32  # SDPA would widen a copy
    assert kv_dtype("model", fp32, one_row_bf16=True, decode_kernel=True) == fp32
    assert kv_dtype("bfloat16", fp32, one_row_bf16=False, decode_kernel=False) == torch.bfloat16
    with pytest.raises(AiengError, match="use auto, model or bfloat16"):
        kv_dtype("fp8", fp32, one_row_bf16=True, decode_kernel=True)


@pytest.mark.parametrize("decode_attention", ["auto", "sdpa"])
def test_a_bf16_kv_cache_holds_half_the_bytes_and_decodes_as_transformers_does_with_bf16_keys_and_values(
    demo, decode_attention
):
    """The engine's bf16 cache against ``generate()`` with keys and values rounded the same way
    (``aieng eval --kv-cache-dtype bfloat16``'s emulation): the same greedy tokens, through the
    kernel and through SDPA, so the recorded accuracy is the served model's."""
    from aieng.engine.reference import reference_greedy
    from aieng.evaluation.kv_rounding import bf16_kv_rounding

    model, tokenizer = demo
    full = Engine(model, tokenizer, config=EngineConfig(compile=False))
    half = Engine(
        model,
        tokenizer,
        config=EngineConfig(compile=False, kv_cache_dtype="bfloat16", decode_attention=decode_attention),
    )
    assert half.runner.cache.keys[0].dtype == torch.bfloat16
    assert half.runner.cache.shape.bytes_per_token() * 2 == full.runner.cache.shape.bytes_per_token()
    prompts = [
        half.encode(p)
        for p in (
            "reverse: apple stone river",
            "add: 27+58",
            "json: name=ana age=31 city=oslo",
            "sort: river apple stone",
            "reverse: boat door glass milk road",
        )
    ]
    ours = [r.token_ids for r in half.generate(prompts, SamplingParams(max_tokens=24, temperature=0))]
    with bf16_kv_rounding(model):
        theirs = reference_greedy(model, prompts, max_new_tokens=24, eos_ids=half.eos_ids, pad_id=half.pad_id)
    assert [list(t) for t in ours] == [list(t) for t in theirs]


def test_a_source_that_does_not_compile_fails_the_build_with_the_compilers_words_and_leaves_nothing(
    tmp_path, monkeypatch
):
    """Sources compile side by side; one failing fails the build, names the error, and leaves no
    half-built library or objects beside the cache."""
    good, bad = tmp_path / "good.cpp", tmp_path / "bad.cpp"
    good.write_text("int aieng_good() { return 1; }\n")
    bad.write_text("int aieng_bad() { return undeclared_name; }\n")
    monkeypatch.setattr(kernels, "SOURCES", (good, bad))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="undeclared_name"):
        kernels._build(kernels.compiler(), cache / "aieng_kernels-test.so")
    assert list(cache.iterdir()) == []
