import json
import shutil

import pytest
import torch

from aieng.errors import AiengError, ModelLoadError, VerificationError
from aieng.loading import check_memory_budget, choose_device, choose_dtype
from aieng.loading.loader import LoadConfig, load_folder, load_version
from aieng.store import ModelRef, ModelStore


@pytest.fixture
def store(tmp_path, tiny_demo_dir):
    store = ModelStore(tmp_path / "store")
    store.register(tiny_demo_dir, "tiny", "1")
    store.promote("tiny", "1")
    return store


def _sample(metric, suffix, **labels):
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(metric + suffix, labels) or 0.0


def test_load_current_version_records_time(store):
    before = _sample("aieng_model_load_seconds", "_count", model="tiny", version="1")
    loaded = load_version(store, ModelRef("tiny"))
    assert loaded.version == "1" and loaded.manifest.version == "1"
    assert loaded.device.type == "cpu" and loaded.dtype == torch.float32
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert not loaded.model.training
    assert loaded.context_length == 512
    assert _sample("aieng_model_load_seconds", "_count", model="tiny", version="1") == before + 1


def test_tampered_weights_are_refused_before_loading(store, monkeypatch):
    weights = store.version_dir("tiny", "1") / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))

    import transformers

    def must_not_load(*_a, **_k):
        raise AssertionError("weights were read before verification")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", must_not_load)
    before = _sample("aieng_model_load_errors_total", "", model="tiny", version="1", code="verification_failed")
    with pytest.raises(VerificationError, match="model.safetensors"):
        load_version(store, ModelRef("tiny"))
    assert (
        _sample("aieng_model_load_errors_total", "", model="tiny", version="1", code="verification_failed")
        == before + 1
    )


def test_memory_budget_refuses_with_numbers(store):
    with pytest.raises(ModelLoadError) as info:
        load_version(store, ModelRef("tiny"), LoadConfig(memory_headroom=1e-9))
    assert info.value.code == "insufficient_memory"
    assert "GiB" in info.value.message and "parameters" in info.value.message and "float32" in info.value.message


def test_budget_arithmetic():
    budget = check_memory_budget("m", 1_000_000, torch.float32, torch.device("cpu"), available_bytes=10 * 1024**3)
    assert budget.needed_bytes == int(1_000_000 * 4 * 1.2) and budget.fits
    with pytest.raises(ModelLoadError, match=r"needs about 0\.\d\d GiB.*only 0\.00 GiB"):
        check_memory_budget("m", 100_000_000, torch.float32, torch.device("cpu"), available_bytes=1000)
    half = check_memory_budget("m", 1_000_000, torch.bfloat16, torch.device("cpu"), available_bytes=10 * 1024**3)
    assert half.needed_bytes * 2 == budget.needed_bytes


def test_dtype_policy_and_override(store):
    assert choose_dtype("auto", torch.device("cpu")) == torch.float32
    assert choose_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        choose_dtype("float7", torch.device("cpu"))
    loaded = load_version(store, ModelRef("tiny"), LoadConfig(dtype="bfloat16"))
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_cuda_requested_without_cuda_is_refused():
    assert choose_device("auto").type == "cpu"
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        choose_device("cuda")
    with pytest.raises(ModelLoadError, match="unknown device"):
        choose_device("tpu:0")


def test_remote_code_models_are_refused(tmp_path, tiny_demo_dir):
    folder = shutil.copytree(tiny_demo_dir, tmp_path / "remote")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(AiengError, match="trust_remote_code"):
        load_folder(folder)


def test_load_folder_loads_an_unregistered_model(tiny_demo_dir):
    loaded = load_folder(tiny_demo_dir)
    assert loaded.version is None and loaded.tokenizer.pad_token_id is not None


def fake_gpu_load(monkeypatch, *, free=80 * 2**30):
    """A CUDA device at torch's boundary: what the loader asks of transformers is recorded."""
    import transformers

    from aieng.loading import loader

    asked = {}
    real = transformers.AutoModelForCausalLM.from_pretrained

    def from_pretrained(path, **kwargs):
        asked.update(kwargs)
        return real(path, **{k: v for k, v in kwargs.items() if k != "device_map"})  # built on the CPU here

    monkeypatch.setattr(loader, "choose_device", lambda requested: torch.device("cuda", 1))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (free, free))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return asked


def test_on_a_gpu_the_weights_load_straight_to_the_device(tiny_demo_dir, monkeypatch):
    """Not the whole state dict in host RAM first and then ``.to(device)``: each tensor goes from
    its file to the GPU (transformers' ``device_map`` with one device)."""
    asked = fake_gpu_load(monkeypatch)
    loaded = load_folder(tiny_demo_dir, LoadConfig(device="cuda:1", dtype="float32"))
    assert asked["device_map"] == "cuda:1" and loaded.device == torch.device("cuda", 1)


def test_on_a_gpu_the_host_check_is_the_largest_shard_not_the_whole_model(tiny_demo_dir, monkeypatch):
    from aieng.loading.memory import check_host_staging

    shard = max(f.stat().st_size for f in tiny_demo_dir.glob("*.safetensors"))
    assert check_host_staging("tiny", tiny_demo_dir, memory_headroom=1.0, available_bytes=shard) == shard
    with pytest.raises(ModelLoadError, match="stages a shard of up to") as refused:
        check_host_staging("tiny", tiny_demo_dir, memory_headroom=0.5, available_bytes=shard)
    assert refused.value.code == "insufficient_memory"
    fake_gpu_load(monkeypatch)
    monkeypatch.setattr("aieng.host.container_limits.limits", lambda: _Limits(shard // 4))
    with pytest.raises(ModelLoadError, match="re-shard the weights"):  # before a byte is read
        load_folder(tiny_demo_dir, LoadConfig(device="cuda:1", dtype="float32"))


class _Limits:
    def __init__(self, available):
        self.memory_available_bytes = available
