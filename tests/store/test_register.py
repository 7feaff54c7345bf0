import json
from pathlib import Path

import pytest

from aieng.errors import StoreError
from aieng.store import Manifest, ModelRef


def test_register_copies_hashes_and_describes_the_model(store, tiny_llama):
    manifest = store.register(tiny_llama, "tiny", "1")
    version_dir = store.version_dir("tiny", "1")
    assert (version_dir / "model.safetensors").is_file()
    assert set(manifest.files) == {"config.json", "generation_config.json", "model.safetensors"}
    assert all(len(sha) == 64 for sha in manifest.files.values())
    assert manifest.architecture == "LlamaForCausalLM"
    assert manifest.num_parameters > 1000
    assert manifest.dtype == "float32"
    assert manifest.context_length == 64
    assert manifest.status == "candidate"
    assert manifest.dependencies["torch"].startswith("2.")
    assert manifest.hardware_profile["cpu_cores"] >= 1
    assert Manifest.read(version_dir).files == manifest.files
    assert store.verify(ModelRef("tiny", "1")).ok


def test_num_parameters_matches_torch(store, tiny_llama):
    from transformers import AutoModelForCausalLM

    manifest = store.register(tiny_llama, "tiny", "1")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, local_files_only=True)
    assert manifest.num_parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth"])
def test_register_refuses_pickle_weights_and_names_convert(store, tiny_llama, suffix):
    (tiny_llama / f"pytorch_model{suffix}").write_bytes(b"\x80\x04pickle")
    with pytest.raises(StoreError, match="aieng model convert"):
        store.register(tiny_llama, "tiny", "1")
    assert store.versions("tiny") == []


def test_register_refuses_an_existing_version_and_keeps_it(store, tiny_llama):
    first = store.register(tiny_llama, "tiny", "1")
    with pytest.raises(StoreError, match="already exists"):
        store.register(tiny_llama, "tiny", "1")
    assert Manifest.read(store.version_dir("tiny", "1")).created_at == first.created_at


def test_register_refuses_a_model_that_is_not_a_causal_lm(store, tiny_llama):
    config = json.loads((tiny_llama / "config.json").read_text())
    config.update(model_type="bert", architectures=["BertModel"])
    (tiny_llama / "config.json").write_text(json.dumps(config))
    with pytest.raises(StoreError, match="not a causal language model|none of which is a causal LM"):
        store.register(tiny_llama, "tiny", "1")


def test_register_refuses_a_model_that_needs_remote_code(store, tiny_llama):
    config = json.loads((tiny_llama / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (tiny_llama / "config.json").write_text(json.dumps(config))
    with pytest.raises(StoreError, match="trust_remote_code"):
        store.register(tiny_llama, "tiny", "1")


def test_register_refuses_folders_without_config_or_weights(store, tmp_path, tiny_llama):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StoreError, match="config.json"):
        store.register(empty, "tiny", "1")
    (tiny_llama / "model.safetensors").unlink()
    with pytest.raises(StoreError, match="no .safetensors"):
        store.register(tiny_llama, "tiny", "1")


def test_register_refuses_a_corrupt_safetensors_header(store, tiny_llama):
    (tiny_llama / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(StoreError, match="not a readable safetensors"):
        store.register(tiny_llama, "tiny", "1")


@pytest.mark.parametrize("bad", ["../evil", "a/b", "", "x@y", ".hidden"])
def test_register_refuses_unsafe_names(store, tiny_llama, bad):
    with pytest.raises(StoreError, match="invalid model"):
        store.register(tiny_llama, bad, "1")
    with pytest.raises(StoreError, match="invalid model version"):
        store.register(tiny_llama, "tiny", bad)


def test_a_crash_during_register_leaves_no_version(store, tiny_llama, monkeypatch):
    import aieng.store.registration as store_module

    def boom(*_args, **_kwargs):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(store_module, "hash_tree", boom)
    with pytest.raises(OSError, match="injected"):
        store.register(tiny_llama, "tiny", "1")
    versions_dir = store.model_dir("tiny") / "versions"
    assert store.versions("tiny") == []
    assert [p.name for p in versions_dir.iterdir()] == []  # no temp dir left behind


def test_register_ignores_hidden_files_and_source_manifest(store, tiny_llama):
    (tiny_llama / ".DS_Store").write_text("x")
    (tiny_llama / "manifest.json").write_text("{}")
    manifest = store.register(tiny_llama, "tiny", "1")
    assert ".DS_Store" not in manifest.files and "manifest.json" not in manifest.files
    assert store.verify(ModelRef("tiny", "1")).ok


def test_register_refuses_even_an_empty_version_folder(store, tiny_llama):
    """An empty versions/<v> still lists as a version; versions are immutable, so it is not filled."""
    empty = store.version_dir("tiny", "1")
    empty.mkdir(parents=True)
    with pytest.raises(StoreError, match="already exists; versions are immutable"):
        store.register(tiny_llama, "tiny", "1")
    assert list(empty.iterdir()) == []
    assert [p.name for p in empty.parent.iterdir()] == ["1"]  # no temp dir left behind


def test_a_version_registered_concurrently_wins_and_ours_is_discarded(store, tiny_llama, monkeypatch):
    """The target is checked again under the model's lock, just before the rename."""
    import aieng.store.registration as store_module

    real_hash_tree = store_module.hash_tree

    def hash_then_lose_the_race(folder):
        hashes = real_hash_tree(folder)
        store.version_dir("tiny", "1").mkdir(parents=True)
        (store.version_dir("tiny", "1") / "manifest.json").write_text("{}")  # the other writer's
        return hashes

    monkeypatch.setattr(store_module, "hash_tree", hash_then_lose_the_race)
    with pytest.raises(StoreError, match="already exists; versions are immutable"):
        store.register(tiny_llama, "tiny", "1")
    assert [p.name for p in store.version_dir("tiny", "1").iterdir()] == ["manifest.json"]
    assert [p.name for p in store.version_dir("tiny", "1").parent.iterdir()] == ["1"]


def test_the_chat_template_gets_a_version_that_changes_only_with_its_hash(store, tiny_demo_dir, tmp_path):
    import shutil

    first = store.register(tiny_demo_dir, "demo", "1").prompt_template
    assert first["version"] == 1 and first["source"] and len(first["sha256"]) == 64
    assert store.register(tiny_demo_dir, "demo", "2").prompt_template == first  # same template, same version
    changed = Path(shutil.copytree(tiny_demo_dir, tmp_path / "changed"))
    config = json.loads((changed / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"] + "{# v2 #}"
    (changed / "tokenizer_config.json").write_text(json.dumps(config))
    second = store.register(changed, "demo", "3").prompt_template
    assert second["version"] == 2 and second["sha256"] != first["sha256"]
    assert store.register(tiny_demo_dir, "demo", "4").prompt_template["version"] == 1  # back to the first


def test_the_space_check_counts_what_register_copies_and_refuses_a_disk_too_small(store, tiny_llama, monkeypatch):
    import shutil
    from collections import namedtuple

    from aieng.store import registration

    (tiny_llama / ".cache").mkdir()
    (tiny_llama / ".cache" / "blob.dat").write_bytes(b"x" * 10_000_000)  # hidden: register does not copy it
    needed, free = registration.check_space(store.root / "not" / "yet", tiny_llama)
    expected = sum(p.stat().st_size for p in tiny_llama.glob("*") if p.is_file())
    assert needed == expected and free > needed

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9, needed))  # a nearly full disk
    with pytest.raises(StoreError, match="GiB free; free space \\(df -h"):
        store.register(tiny_llama, "m", "1")
    assert store.names() == [] or store.versions("m") == []
