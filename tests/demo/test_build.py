"""Demo build: complete Hugging Face folder, deterministic, atomic."""

import hashlib
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import aieng.demo.build as build_module
from aieng.demo.build import BUILD_INFO_FILE, MODEL_FILES, DemoBuildConfig, build_demo_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _leftovers(parent):
    return [p.name for p in parent.iterdir() if ".building-" in p.name]


def test_tiny_build_writes_a_loadable_model_folder(tiny_demo_dir):
    for name in (*MODEL_FILES, BUILD_INFO_FILE):
        assert (tiny_demo_dir / name).is_file(), name
    assert _leftovers(tiny_demo_dir.parent) == []

    tokenizer = AutoTokenizer.from_pretrained(tiny_demo_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_demo_dir, local_files_only=True)
    assert model.config.model_type == "llama"
    assert model.config.max_position_embeddings == 512
    dims = DemoBuildConfig.tiny().dims  # the config's shape is the one the model was built with
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (dims.hidden_size, dims.num_layers)
    assert model.config.num_key_value_heads == dims.num_kv_heads
    assert model.config.vocab_size == len(tokenizer)

    generation = GenerationConfig.from_pretrained(tiny_demo_dir, local_files_only=True)
    assert generation.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|end|>")
    assert generation.pad_token_id == tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<|pad|>")
    assert generation.bos_token_id == tokenizer.bos_token_id

    config = json.loads((tiny_demo_dir / "tokenizer_config.json").read_text())
    assert "<|assistant|>" in config["chat_template"]

    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "reverse: apple moon"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]


def test_build_info_records_provenance(tiny_demo_dir):
    info = json.loads((tiny_demo_dir / BUILD_INFO_FILE).read_text())
    assert info["config"] == json.loads(json.dumps(asdict(DemoBuildConfig.tiny())))
    assert info["config"]["dims"]["hidden_size"] == 32  # the shape is recorded under "dims"
    assert info["seed"] == 0 and info["steps"] == 12
    assert info["final_loss"] > 0 and info["wall_seconds"] > 0 and info["tokens_per_second"] > 0
    assert info["versions"]["torch"] == torch.__version__


def test_same_seed_gives_identical_weights(tmp_path):
    config = DemoBuildConfig.tiny(steps=6)
    a = build_demo_model(tmp_path / "a", config, progress=False)
    b = build_demo_model(tmp_path / "b", config, progress=False)
    c = build_demo_model(tmp_path / "c", DemoBuildConfig.tiny(steps=6, seed=1), progress=False)
    assert _sha256(a / "model.safetensors") == _sha256(b / "model.safetensors")
    assert _sha256(a / "tokenizer.json") == _sha256(b / "tokenizer.json")
    assert _sha256(a / "model.safetensors") != _sha256(c / "model.safetensors")


def test_progress_bar_shows_step_loss_and_throughput(tmp_path, capfd):
    build_demo_model(tmp_path / "m", DemoBuildConfig.tiny(steps=3), progress=True)
    err = capfd.readouterr().err
    assert "3/3" in err and "loss=" in err and "tok_s=" in err


def test_build_refuses_a_non_empty_out_dir_and_leaves_it_alone(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        build_demo_model(out, DemoBuildConfig.tiny(steps=2), progress=False)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert _leftovers(tmp_path) == []


def test_build_accepts_an_existing_empty_out_dir(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    build_demo_model(out, DemoBuildConfig.tiny(steps=2), progress=False)
    assert (out / "model.safetensors").is_file()


def test_failed_build_leaves_no_temp_dir_and_no_out_dir(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("simulated crash during training")

    monkeypatch.setattr(build_module, "train", boom)
    out = tmp_path / "model"
    with pytest.raises(RuntimeError, match="simulated crash"):
        build_demo_model(out, DemoBuildConfig.tiny(steps=2), progress=False)
    assert not out.exists()
    assert _leftovers(tmp_path) == []


def test_sigterm_during_a_build_leaves_nothing_behind(tmp_path):
    out = tmp_path / "model"
    script = (
        "import sys; from pathlib import Path; from aieng.demo.build import DemoBuildConfig, build_demo_model; "
        "build_demo_model(Path(sys.argv[1]), DemoBuildConfig.tiny(steps=100000), progress=False)"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=REPO_ROOT)
    try:
        deadline = time.monotonic() + 120
        while not _leftovers(tmp_path):  # the temporary folder appears once the build starts
            assert proc.poll() is None, "the build ended before it could be interrupted"
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.1)
        time.sleep(1.0)  # well into corpus generation or training
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _leftovers(tmp_path) == []
    assert not out.exists()


def test_a_dead_builds_temporary_folder_is_removed_by_the_next_build(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".model.building-{socket.gethostname()}-{dead.pid}-deadbeef"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    other_host = tmp_path / ".model.building-elsewhere-1-cafecafe"
    other_host.mkdir()
    build_demo_model(tmp_path / "model", DemoBuildConfig.tiny(steps=2), progress=False)
    assert not stale.exists()
    assert other_host.exists()  # not ours to judge
