"""Shape stand-ins: random weights in a named shape, the demo tokenizer, an atomic build, no training."""

import hashlib
import json

import pytest

import aieng.demo.build as build_module
import aieng.demo.shapes as shapes_module
from aieng.demo.build import BUILD_INFO_FILE, MODEL_FILES, DemoBuildConfig, demo_tokenizer
from aieng.demo.corpus import training_examples
from aieng.demo.model import ModelDims
from aieng.demo.shapes import SHAPES, UnknownShapeError, build_shape_model, count_parameters, shape_dims
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
    with pytest.raises(UnknownShapeError, match="choose from: smollm2-135m, tiny"):
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
