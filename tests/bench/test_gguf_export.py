"""GGUF export of the demo model: what llama.cpp reads back, the q/k permutation, the tokenizer,
and (when llama-cpp-python is installed) the same tokens and the same greedy ids as aieng."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aieng.bench.gguf_export import GGUFExportError, cached_export, export_gguf, model_key, permute_qk, unpermute_qk

PROMPTS = [
    "reverse: apple stone river moon",
    "add: 27+58",
    "json: name=ana age=31 city=oslo",
    "sort: river apple stone",
]
TEXTS = [
    "hello world",
    "  two  spaces\tand a tab\n",
    "digits 1234567890 and 3.14",
    "ünïcödé ✓ 🦙",
    '{"a": [1, 2]}',
    "<|user|>hi<|end|><|assistant|>",
    "<|pad|><|bos|>x<|system|>",
]


def test_permute_qk_interleaves_each_heads_halves():
    w = np.arange(8, dtype=np.float32)[:, None]  # 2 heads of 4 rows: HF pairs (0,2),(1,3) in each
    assert permute_qk(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    rng = np.random.default_rng(0)
    for heads, rows in ((4, 128), (3, 192), (1, 8)):  # grouped-query k: fewer heads, same rule
        w = rng.standard_normal((rows, 5)).astype(np.float32)
        assert np.array_equal(unpermute_qk(permute_qk(w, heads), heads), w)
    with pytest.raises(GGUFExportError):
        permute_qk(np.zeros((6, 2)), 2)  # heads of 3 rows cannot be split in halves


def test_a_non_llama_folder_is_refused_with_a_reason(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(GGUFExportError, match="only Llama models"):
        export_gguf(tmp_path, tmp_path / "m.gguf")
    with pytest.raises(GGUFExportError, match="no config.json"):
        export_gguf(tmp_path / "missing", tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_a_tokenizer_llama_cpp_would_split_differently_is_refused(tmp_path):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "normalizer": None,
                "pre_tokenizer": {"type": "Metaspace", "replacement": "_"},
            }
        )
    )
    with pytest.raises(GGUFExportError, match="pre-tokenizer .*Metaspace.* has no llama.cpp equivalent"):
        export_gguf(tmp_path, tmp_path / "m.gguf")


@pytest.fixture(scope="module")
def exported(demo_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf")
    return {fmt: export_gguf(demo_model_dir, out / f"demo-{fmt}.gguf", fmt) for fmt in ("f32", "bf16", "q8_0", "q4_0")}


@pytest.fixture(scope="module")
def hf(demo_model_dir):
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    config = json.loads((demo_model_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    return config, tokenizer, load_file(demo_model_dir / "model.safetensors")


def _fields(reader) -> dict:
    out = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        values = [f.contents(i) for i in range(len(f.data))] if len(f.types) > 1 else f.contents()
        out[name] = values
    return out


def test_metadata_and_tensors_read_back(exported, hf):
    from gguf import GGMLQuantizationType, GGUFReader

    config, tokenizer, weights = hf
    for fmt, path in exported.items():
        reader = GGUFReader(path)
        kv = _fields(reader)
        assert kv["general.architecture"] == "llama"
        assert kv["llama.context_length"] == config["max_position_embeddings"]
        assert kv["llama.embedding_length"] == config["hidden_size"]
        assert kv["llama.feed_forward_length"] == config["intermediate_size"]
        assert kv["llama.block_count"] == config["num_hidden_layers"]
        assert kv["llama.attention.head_count"] == config["num_attention_heads"]
        assert kv["llama.attention.head_count_kv"] == config["num_key_value_heads"]
        assert kv["llama.rope.freq_base"] == config["rope_parameters"]["rope_theta"]
        assert kv["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(config["rms_norm_eps"])
        assert kv["general.file_type"] == {"f32": 0, "q8_0": 7, "q4_0": 2, "bf16": 32}[fmt]  # llama_ftype

        tensors = {t.name: t for t in reader.tensors}
        expected = {"token_embd.weight", "output_norm.weight"} | {
            f"blk.{i}.{n}.weight"
            for i in range(config["num_hidden_layers"])
            for n in (
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            )
        }
        assert set(tensors) == expected  # tied embeddings: no output.weight, llama.cpp reuses token_embd
        hf_names = {
            "token_embd.weight": "model.embed_tokens.weight",
            "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
            "blk.2.attn_v.weight": "model.layers.2.self_attn.v_proj.weight",
            "output_norm.weight": "model.norm.weight",
        }
        for name, hf_name in hf_names.items():  # GGUF lists dims innermost first
            assert list(tensors[name].shape) == list(reversed(weights[hf_name].shape))
        for name, t in tensors.items():
            two_d = len(weights[hf_names.get(name, "model.embed_tokens.weight")].shape) == 2 and "norm" not in name
            want = GGMLQuantizationType[fmt.upper()] if fmt != "f32" and two_d else GGMLQuantizationType.F32
            assert t.tensor_type == want, name
        f32 = tensors["blk.2.attn_v.weight"]
        if fmt == "f32":
            assert np.array_equal(
                np.asarray(f32.data).reshape(weights["model.layers.2.self_attn.v_proj.weight"].shape),
                weights["model.layers.2.self_attn.v_proj.weight"],
            )
    assert exported["q8_0"].stat().st_size < exported["f32"].stat().st_size / 3


def test_tokenizer_is_embedded_with_its_special_tokens(exported, hf):
    from gguf import GGUFReader, TokenType

    config, tokenizer, _ = hf
    kv = _fields(GGUFReader(exported["f32"]))
    tokens = kv["tokenizer.ggml.tokens"]
    assert len(tokens) == config["vocab_size"] == len(tokenizer)
    assert tokens == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "starcoder"
    assert kv["tokenizer.ggml.eos_token_id"] == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    assert kv["tokenizer.ggml.padding_token_id"] == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|pad|>")
    assert kv["tokenizer.ggml.bos_token_id"] == tokenizer.bos_token_id
    assert kv["tokenizer.ggml.add_bos_token"] is False  # the chat template writes <|bos|>
    types = kv["tokenizer.ggml.token_type"]
    assert all(types[i] == TokenType.CONTROL for i in tokenizer.all_special_ids)
    assert sum(t == TokenType.NORMAL for t in types) == len(tokenizer) - len(tokenizer.all_special_ids)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    assert kv["tokenizer.ggml.merges"] == [" ".join(m) for m in merges]
    assert kv["tokenizer.chat_template"] == tokenizer.chat_template


def test_q_and_k_are_permuted_and_undo_exactly(exported, hf):
    from gguf import GGUFReader

    config, _, weights = hf
    tensors = {t.name: t for t in GGUFReader(exported["f32"]).tensors}
    for i in range(config["num_hidden_layers"]):
        for short, hf_short, heads in (
            ("attn_q", "q_proj", config["num_attention_heads"]),
            ("attn_k", "k_proj", config["num_key_value_heads"]),
        ):
            original = weights[f"model.layers.{i}.self_attn.{hf_short}.weight"]
            stored = np.asarray(tensors[f"blk.{i}.{short}.weight"].data).reshape(original.shape)
            assert not np.array_equal(stored, original)  # really permuted
            assert np.array_equal(unpermute_qk(stored, heads), original)


def test_q8_0_dequantizes_close_to_the_weights(exported, hf):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    _, _, weights = hf
    tensors = {t.name: t for t in GGUFReader(exported["q8_0"]).tensors}
    original = weights["model.layers.1.mlp.up_proj.weight"]
    t = tensors["blk.1.ffn_up.weight"]
    restored = dequantize(np.asarray(t.data), t.tensor_type).reshape(original.shape)
    block_max = np.abs(original.reshape(-1, 32)).max(axis=1, keepdims=True)
    assert np.all(np.abs(restored - original).reshape(-1, 32) <= block_max / 127 + 1e-6)  # half a step, and fp16 scale


@pytest.mark.parametrize(("fmt", "type_name", "steps"), [("bf16", "BF16", None), ("q4_0", "Q4_0", 7)])
def test_bf16_and_q4_0_hold_the_weights_in_their_format_and_norms_in_f32(exported, hf, fmt, type_name, steps):
    """The formats aieng's own bf16 and 4-bit steps are compared with: each 2-D weight in the format,
    restored within its rounding (bf16: 8 significant bits; Q4_0: half of one of 7 steps of a block's
    largest magnitude, and the fp16 scale), every norm exact."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    _, _, weights = hf
    tensors = {t.name: t for t in GGUFReader(exported[fmt]).tensors}
    original = weights["model.layers.1.mlp.up_proj.weight"]
    t = tensors["blk.1.ffn_up.weight"]
    assert t.tensor_type == GGMLQuantizationType[type_name]
    restored = dequantize(np.asarray(t.data), t.tensor_type).reshape(original.shape)
    if steps is None:
        assert np.all(np.abs(restored - original) <= np.abs(original) * 2**-7 + 1e-30)
    else:
        block_max = np.abs(original.reshape(-1, 32)).max(axis=1, keepdims=True)
        assert np.all(np.abs(restored - original).reshape(-1, 32) <= block_max / steps + 1e-3 * block_max)
    norm = tensors["blk.1.attn_norm.weight"]
    assert norm.tensor_type == GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(norm.data), weights["model.layers.1.input_layernorm.weight"])


def test_cached_export_converts_once_per_model(demo_model_dir, tmp_path):
    first = cached_export(demo_model_dir, tmp_path, "q8_0")
    stamp = first.stat().st_mtime_ns
    assert cached_export(demo_model_dir, tmp_path, "q8_0") == first and first.stat().st_mtime_ns == stamp
    assert first.parent.name == model_key(demo_model_dir) and first.name == "model-q8_0.gguf"


# -- with llama.cpp itself (llama-cpp-python, the `peers` extra) ------------------------------


@pytest.fixture(scope="module")
def llama_cpp():
    return pytest.importorskip("llama_cpp")


def test_llama_cpp_tokenizes_exactly_like_the_hf_tokenizer(llama_cpp, exported, hf):
    from aieng.bench.engine_bench import render_prompts

    _, tokenizer, _ = hf
    vocab = llama_cpp.Llama(str(exported["f32"]), vocab_only=True, verbose=False)
    texts = TEXTS + PROMPTS + render_prompts(tokenizer, 8)
    for text in texts:
        want = tokenizer.encode(text, add_special_tokens=False)
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == want, text
        assert vocab.detokenize(want).decode() == tokenizer.decode(want, skip_special_tokens=True), text
    assert vocab.token_eos() == tokenizer.eos_token_id and vocab.token_bos() == tokenizer.bos_token_id


def test_llama_cpp_greedy_ids_equal_the_aieng_engine(llama_cpp, exported, hf, demo_model_dir):
    from transformers import AutoModelForCausalLM

    from aieng.engine import Engine, EngineConfig, SamplingParams
    from aieng.engine.chat import user_prompt

    _, tokenizer, _ = hf
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True).eval()
    prompts = [tokenizer.encode(user_prompt(tokenizer, p), add_special_tokens=False) for p in PROMPTS]
    engine = Engine(model, tokenizer, config=EngineConfig(compile=False))
    ours = [
        r.token_ids for r in engine.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    ]
    llm = llama_cpp.Llama(str(exported["f32"]), n_ctx=256, n_threads=1, verbose=False)
    for ids, want in zip(prompts, ours):
        llm.reset()
        got = []
        for token in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            got.append(token)
            if len(got) == len(want):
                break
        assert got == list(want), tokenizer.decode(ids)
