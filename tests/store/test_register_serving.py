"""Register refuses, from config.json alone and before anything is copied, a model no forward
serves exactly (``aieng.engine.serving_path``), and says why and what to do."""

import json
import subprocess
import sys

import pytest

from aieng.errors import StoreError

LONGROPE_PAST_ITS_THRESHOLD = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                               "long_factor": [4.0] * 4, "factor": 4.0, "original_max_position_embeddings": 16}


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def nothing_written(store, name: str) -> bool:
    return store.versions(name) == [] and not any(name in p.name for p in store.root.rglob("*"))


def test_a_config_no_forward_serves_exactly_is_refused_with_the_reason(store, tiny_llama):
    edit_config(tiny_llama, rope_parameters=LONGROPE_PAST_ITS_THRESHOLD)
    with pytest.raises(StoreError, match=r"cannot be served exactly.*longrope.*original_max_position_embeddings \(16\)"
                                         r".*max_position_embeddings is at most 16") as caught:
        store.register(tiny_llama, "tiny", "1")
    assert caught.value.code == "unsupported_model"
    assert nothing_written(store, "tiny")


def test_an_unchecked_model_type_is_refused_by_name(store, tiny_llama):
    edit_config(tiny_llama, model_type="opt", architectures=["OPTForCausalLM"])
    with pytest.raises(StoreError, match=r"model type 'opt' has no greedy-parity check"):
        store.register(tiny_llama, "tiny", "1")
    assert nothing_written(store, "tiny")


def test_a_config_transformers_rejects_is_refused(store, tiny_llama):
    edit_config(tiny_llama, hidden_size=15)  # not a multiple of the 2 heads: LlamaConfig refuses it
    with pytest.raises(StoreError, match=r"is not a valid 'llama' config"):
        store.register(tiny_llama, "tiny", "1")
    assert nothing_written(store, "tiny")


@pytest.mark.parametrize("changes, kind", [({}, "native"), ({"hidden_act": "gelu"}, "transformers"),
                                           ({"attention_bias": True, "mlp_bias": True}, "native")])
def test_configs_a_forward_serves_exactly_register(store, tiny_llama, changes, kind):
    from aieng.store.introspect import inspect_folder

    assert inspect_folder(edit_config(tiny_llama, **changes)).serving == kind
    assert store.register(tiny_llama, "tiny", "1").architecture == "LlamaForCausalLM"


def test_aieng_model_register_exits_non_zero_with_the_reason_and_no_version(tmp_path, tiny_llama):
    edit_config(tiny_llama, rope_parameters=LONGROPE_PAST_ITS_THRESHOLD)
    store = tmp_path / "store"
    result = subprocess.run([sys.executable, "-m", "aieng", "--store", str(store), "model", "register",
                             str(tiny_llama), "--name", "tiny", "--version", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.startswith("aieng: error: ") and result.stderr.strip().count("\n") == 0
    assert "cannot be served exactly" in result.stderr and "longrope" in result.stderr
    assert not (store / "tiny").exists()
