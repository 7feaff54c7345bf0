"""Shape stand-ins: random weights in a named shape, the demo tokenizer, an atomic build, no training."""

import hashlib
import json
import re

import pytest

import aieng.demo.build as build_module
import aieng.demo.shapes as shapes_module
from aieng.demo.build import BUILD_INFO_FILE, MODEL_FILES, DemoBuildConfig, demo_tokenizer
from aieng.demo.corpus import training_examples
from aieng.demo.model import ModelDims
from aieng.demo.shapes import (
    FILLER_PREFIX,
    SHAPES,
    UnknownShapeError,
    build_shape_model,
    count_parameters,
    shape_dims,
    widen_tokenizer,
)
from aieng.demo.tokenizer import render_documents

from ..command import aieng


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(parent):
    return [p.name for p in parent.iterdir() if ".building-" in p.name]


def test_tiny_shape_writes_every_file_and_its_config_is_the_shape(tiny_shape_model_dir):
    for name in (*MODEL_FILES, BUILD_INFO_FILE):
        assert (tiny_shape_model_dir / name).is_file(), name
    assert _leftovers(tiny_shape_model_dir.parent) == []
    config = json.loads((tiny_shape_model_dir / "config.json").read_text())
    dims = SHAPES["tiny"].dims
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (64, 128, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (dims.num_heads, dims.num_kv_heads)
    assert config["num_attention_heads"] > config["num_key_value_heads"]  # grouped-query attention
    assert config["max_position_embeddings"] == dims.context_length == 256
    assert config["rope_parameters"]["rope_theta"] == dims.rope_theta
    assert config["tie_word_embeddings"] is True


def test_the_build_record_says_random_weights(tiny_shape_model_dir):
    info = json.loads((tiny_shape_model_dir / BUILD_INFO_FILE).read_text())
    assert info["shape"] == "tiny" and info["random_weights"] is True and info["seed"] == 0
    assert "noise" in info["note"]
    assert info["dims"]["num_kv_heads"] == 2
    assert "config" not in info and "steps" not in info  # never mistaken for a trained demo build


def test_the_tokenizer_is_the_trained_demo_builds(tmp_path, tiny_shape_model_dir):
    from transformers import AutoTokenizer

    from aieng.demo.tokenizer import save_tokenizer

    save_tokenizer(demo_tokenizer(), tmp_path)  # what `aieng demo build` (default config) writes
    assert _sha256(tiny_shape_model_dir / "tokenizer.json") == _sha256(tmp_path / "tokenizer.json")
    ours = AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)
    demo = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    prompts = render_documents(demo, training_examples(0, 20), with_answer=False)
    assert [ours.encode(p, add_special_tokens=False) for p in prompts] == [
        demo.encode(p, add_special_tokens=False) for p in prompts
    ]
    assert ours.model_max_length == 256  # the shape's context, not the demo's 512


def test_same_seed_same_weights_other_seed_other_weights(tmp_path, tiny_shape_model_dir):
    again = build_shape_model(tmp_path / "again", "tiny", seed=0)
    other = build_shape_model(tmp_path / "other", "tiny", seed=1)
    assert _sha256(again / "model.safetensors") == _sha256(tiny_shape_model_dir / "model.safetensors")
    assert _sha256(other / "model.safetensors") != _sha256(again / "model.safetensors")


def test_the_build_never_trains(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("a shape build must not train")

    monkeypatch.setattr(build_module, "train", boom)
    assert (build_shape_model(tmp_path / "m", "tiny") / "model.safetensors").is_file()


def test_smollm2_135m_has_its_layers_and_about_106m_parameters():
    dims = SHAPES["smollm2-135m"].dims
    assert (dims.hidden_size, dims.num_layers, dims.num_heads, dims.num_kv_heads) == (576, 30, 9, 3)
    assert (dims.intermediate_size, dims.rope_theta, dims.context_length) == (1536, 100000.0, 2048)
    assert dims.tie_word_embeddings and dims.initializer_range == 0.02
    vocab = 564  # the demo tokenizer's (checked against the built tiny shape in the next test)
    n = count_parameters(dims, vocab)  # meta device: no weights allocated
    assert 105e6 < n < 108e6
    per_layer = 576 * (576 * 2 + 192 * 2) + 3 * 576 * 1536 + 2 * 576
    assert n == 30 * per_layer + vocab * 576 + 576


@pytest.mark.parametrize(
    ("name", "layers", "hidden", "heads", "mlp", "vocab", "millions"),
    [
        ("qwen2.5-0.5b", 24, 896, (14, 2), 4864, 151936, 494.0),
        ("llama-3.2-1b", 16, 2048, (32, 8), 8192, 128256, 1235.8),
    ],
)
def test_user_sized_shapes_have_the_real_models_layers_and_full_vocabulary(
    name, layers, hidden, heads, mlp, vocab, millions
):
    shape = SHAPES[name]
    dims = shape.dims
    assert (dims.num_layers, dims.hidden_size, (dims.num_heads, dims.num_kv_heads)) == (layers, hidden, heads)
    assert dims.intermediate_size == mlp and dims.tie_word_embeddings
    assert shape.vocab_size == vocab and shape.dtype == "bfloat16"  # as the real checkpoints ship
    assert dims.hidden_size // dims.num_heads == 64  # both real models' head_dim
    n = count_parameters(dims, vocab)
    assert round(n / 1e6, 1) == millions
    kv = dims.num_kv_heads * 64
    per_layer = hidden * (hidden * 2 + kv * 2) + 3 * hidden * mlp + 2 * hidden
    assert n == layers * per_layer + vocab * hidden + hidden  # the embedding counted once (tied)


def test_widening_keeps_every_demo_id_and_fills_the_rest_with_unreachable_tokens():
    from tokenizers import Tokenizer

    demo_json = demo_tokenizer().backend_tokenizer.to_str()
    demo = Tokenizer.from_str(demo_json)
    wide = Tokenizer.from_str(widen_tokenizer(demo_json, 2000))
    assert wide.get_vocab_size() == 2000
    assert all(wide.id_to_token(i) == demo.id_to_token(i) for i in range(demo.get_vocab_size()))
    assert wide.id_to_token(1999) == f"{FILLER_PREFIX}1999"
    text = "reverse: w600 w1999 apple 27+72 你好"  # filler-like text and Chinese still tokenize as the demo does
    assert wide.encode(text).ids == demo.encode(text).ids
    assert max(wide.encode(text).ids) < demo.get_vocab_size()
    assert wide.decode([1999, 600], skip_special_tokens=False) == " w1999 w600"
    with pytest.raises(ValueError, match="smaller than the demo tokenizer"):
        widen_tokenizer(demo_json, 10)


def test_a_wide_vocabulary_shape_loads_in_bf16_and_every_sampled_id_decodes(tmp_path):
    from safetensors import safe_open

    from aieng.engine import Engine, EngineConfig
    from aieng.engine.params import SamplingParams
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.store import ModelRef, ModelStore

    folder = build_shape_model(tmp_path / "wide", "tiny-wide-vocab")
    info = json.loads((folder / BUILD_INFO_FILE).read_text())
    config = json.loads((folder / "config.json").read_text())
    assert info["vocab_size"] == config["vocab_size"] == 8192 and info["demo_tokens"] == 564
    assert config["dtype"] == "bfloat16"
    with safe_open(folder / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    store = ModelStore(tmp_path / "store")
    store.register(folder, "wide", "1")
    loaded = load_version(store, ModelRef("wide", "1"), LoadConfig(device="cpu"))
    assert len(loaded.tokenizer) == loaded.model.config.vocab_size == 8192
    engine = Engine(loaded.model, loaded.tokenizer, config=EngineConfig(compile=False))
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    (result,) = engine.generate(["add: 2+3"], params)
    assert result.completion_tokens == 24
    assert any(t >= 564 for t in result.token_ids)  # noise over the whole vocabulary, as the real size
    assert re.search(r" w\d{3,4}", result.text)  # a filler token decodes to text, not to nothing


def test_count_parameters_matches_the_built_model(tiny_shape_model_dir):
    info = json.loads((tiny_shape_model_dir / BUILD_INFO_FILE).read_text())
    assert info["vocab_size"] == 564
    assert count_parameters(SHAPES["tiny"].dims, info["vocab_size"]) == info["num_parameters"]


def test_registers_loads_and_generates(tmp_path, tiny_shape_model_dir):
    from aieng.engine import Engine, EngineConfig
    from aieng.engine.params import SamplingParams
    from aieng.loading.loader import LoadConfig, load_version
    from aieng.store import ModelRef, ModelStore

    store = ModelStore(tmp_path / "store")
    manifest = store.register(tiny_shape_model_dir, "tiny", "1")
    assert manifest.context_length == 256
    loaded = load_version(store, ModelRef("tiny", "1"), LoadConfig(device="cpu"))
    assert loaded.model.config.num_key_value_heads == 2
    engine = Engine(loaded.model, loaded.tokenizer, config=EngineConfig(compile=False))
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "reverse: apple moon"}], tokenize=False, add_generation_prompt=True
    )
    results = engine.generate([prompt, "add: 2+3"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert [r.completion_tokens for r in results] == [4, 4]


def test_unknown_shape_lists_the_choices_and_writes_nothing(tmp_path):
    with pytest.raises(UnknownShapeError, match="choose from: smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, tiny"):
        build_shape_model(tmp_path / "m", "gpt-5")
    with pytest.raises(ValueError):
        shape_dims("nope")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def boom(*args, **kwargs):  # after model.safetensors is written: a half-full temp folder
        raise RuntimeError("simulated crash while saving the tokenizer")

    monkeypatch.setattr("aieng.demo.tokenizer.save_tokenizer", boom)
    out = tmp_path / "model"
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_shape_model(out, "tiny")
    assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_refuses_a_non_empty_out_dir(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        build_shape_model(out, "tiny")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_progress_names_every_step(tmp_path, capsys):
    build_shape_model(tmp_path / "m", "tiny", progress=True)
    err = capsys.readouterr().err
    for step in ("tokenizer", "random weights", "writing", "done in"):
        assert step in err, step


def _cli(*args):
    return aieng("demo", "build", *args)


def test_cli_help_unknown_shape_and_steps(tmp_path):
    helped = _cli("--help")
    assert helped.returncode == 0 and "smollm2-135m" in helped.stdout and "tiny" in helped.stdout
    assert "noise" in helped.stdout
    bad = _cli("--shape", "nope", "--out", str(tmp_path / "a"))
    assert bad.returncode == 2 and "smollm2-135m" in bad.stderr and "tiny" in bad.stderr
    both = _cli("--shape", "tiny", "--steps", "5", "--out", str(tmp_path / "b"))
    assert both.returncode == 2 and "--steps" in both.stderr
    assert list(tmp_path.iterdir()) == []


def test_shape_dims_are_model_dims():
    assert all(isinstance(shape.dims, ModelDims) for shape in SHAPES.values())
    assert DemoBuildConfig().dims not in [s.dims for s in SHAPES.values()]
    assert shapes_module.SHAPE_BUILD_VERSION
