import pytest
import torch

from aieng.errors import StoreError
from aieng.store.convert import convert_to_safetensors


def test_convert_pickle_to_safetensors_then_register(store, tiny_llama, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(tiny_llama / "model.safetensors")
    (tiny_llama / "model.safetensors").unlink()
    torch.save(weights, tiny_llama / "pytorch_model.bin")
    with pytest.raises(StoreError, match="aieng model convert"):
        store.register(tiny_llama, "tiny", "1")

    out = convert_to_safetensors(tiny_llama, tmp_path / "converted")
    assert not (out / "pytorch_model.bin").exists()
    converted = load_file(out / "model.safetensors")
    assert converted.keys() == weights.keys()
    assert all(torch.equal(converted[k], weights[k]) for k in weights)
    assert store.register(out, "tiny", "1").architecture == "LlamaForCausalLM"


def test_convert_refuses_objects_that_are_not_tensors(tiny_llama, tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("code ran",))

    (tiny_llama / "model.safetensors").unlink()
    torch.save({"w": Payload()}, tiny_llama / "pytorch_model.bin")
    with pytest.raises(StoreError, match="tensors-only"):
        convert_to_safetensors(tiny_llama, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_convert_refuses_a_non_empty_destination_and_a_folder_without_pickles(tiny_llama, tmp_path):
    with pytest.raises(StoreError, match="no pickle weights"):
        convert_to_safetensors(tiny_llama, tmp_path / "out")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(StoreError, match="not empty"):
        convert_to_safetensors(tiny_llama, busy)


def test_convert_fills_an_existing_empty_destination(tiny_llama, tmp_path):
    from safetensors.torch import load_file

    weights = load_file(tiny_llama / "model.safetensors")
    (tiny_llama / "model.safetensors").unlink()
    torch.save(weights, tiny_llama / "pytorch_model.bin")
    out = tmp_path / "out"
    out.mkdir()
    assert convert_to_safetensors(tiny_llama, out) == out
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]  # no temp folder left
