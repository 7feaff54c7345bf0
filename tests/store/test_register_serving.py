"""Register refuses, from config.json alone and before anything is copied, a model no forward
serves exactly (``aieng.engine.serving_path``), and says why and what to do."""

import json

import pytest

from aieng.errors import StoreError

from ..command import aieng

LONGROPE_PAST_ITS_THRESHOLD = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0] * 4,
    "long_factor": [4.0] * 4,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
}


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def nothing_written(store, name: str) -> bool:
    return store.versions(name) == [] and not any(name in p.name for p in store.root.rglob("*"))


def test_a_config_no_forward_serves_exactly_is_refused_with_the_reason(store, tiny_llama):
    edit_config(tiny_llama, rope_parameters=LONGROPE_PAST_ITS_THRESHOLD)
    with pytest.raises(
        StoreError,
        match=r"cannot be served exactly.*longrope.*original_max_position_embeddings \(16\)"
        r".*max_position_embeddings is at most 16",
    ) as caught:
        store.register(tiny_llama, "tiny", "1")
    assert caught.value.code == "unsupported_model"
    assert nothing_written(store, "tiny")


def test_an_unchecked_model_type_is_refused_by_name(store, tiny_llama):
    edit_config(tiny_llama, model_type="xglm", architectures=["XGLMForCausalLM"])
    with pytest.raises(StoreError, match=r"model type 'xglm' has no greedy-parity check"):
        store.register(tiny_llama, "tiny", "1")
    assert nothing_written(store, "tiny")


@pytest.mark.parametrize(
    "changes, reason",
    [
        (
            {
                "model_type": "qwen3_next",
                "architectures": ["Qwen3NextForCausalLM"],
                "layer_types": ["linear_attention"],
            },
            r"model type 'qwen3_next' has linear_attention layers, which keep a recurrent state: the batch cache holds "
            r"attention keys and values only",
        ),
        (
            {
                "model_type": "gemma3",
                "architectures": ["Gemma3ForConditionalGeneration"],
                "text_config": {
                    "model_type": "gemma3_text",
                    "hidden_size": 16,
                    "intermediate_size": 32,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 1,
                    "head_dim": 8,
                    "vocab_size": 64,
                },
            },
            r"model type 'gemma3' is a multimodal checkpoint .*serve a text-only checkpoint of the language model "
            r"\(model_type 'gemma3_text'\)",
        ),
        (
            {"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "use_bidirectional_attention": True},
            r"use_bidirectional_attention: an encoder configuration",
        ),
        (
            {
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
                "layer_types": ["sliding_attention"],
                "sliding_window": None,
            },
            r"sliding_attention layers without a sliding_window .*qwen3 forward fails on it",
        ),
    ],
    ids=["hybrid", "multimodal", "bidirectional", "window-less sliding layers"],
)
def test_a_model_no_checked_forward_serves_is_refused_with_a_precise_reason(store, tiny_llama, changes, reason):
    edit_config(tiny_llama, **changes)
    with pytest.raises(StoreError, match=r"cannot be served exactly.*" + reason) as caught:
        store.register(tiny_llama, "tiny", "1")
    assert caught.value.code == "unsupported_model"
    assert nothing_written(store, "tiny")


@pytest.mark.parametrize(
    "model_type, architecture",
    [
        ("qwen3", "Qwen3ForCausalLM"),
        ("qwen3_moe", "Qwen3MoeForCausalLM"),
        ("phi3", "Phi3ForCausalLM"),
        ("gemma2", "Gemma2ForCausalLM"),
        ("gemma3_text", "Gemma3ForCausalLM"),
        ("mixtral", "MixtralForCausalLM"),
        ("starcoder2", "Starcoder2ForCausalLM"),
        ("opt", "OPTForCausalLM"),
    ],
)
def test_checked_model_types_register_for_the_transformers_forward(store, tiny_llama, model_type, architecture):
    from aieng.store.introspect import inspect_folder

    edit_config(tiny_llama, model_type=model_type, architectures=[architecture])
    assert inspect_folder(tiny_llama).serving == "transformers"
    assert store.register(tiny_llama, "tiny", "1").architecture == architecture


def test_a_config_transformers_rejects_is_refused(store, tiny_llama):
    edit_config(tiny_llama, hidden_size=15)  # not a multiple of the 2 heads: LlamaConfig refuses it
    with pytest.raises(StoreError, match=r"is not a valid 'llama' config"):
        store.register(tiny_llama, "tiny", "1")
    assert nothing_written(store, "tiny")


@pytest.mark.parametrize(
    "changes, kind",
    [({}, "native"), ({"hidden_act": "gelu"}, "transformers"), ({"attention_bias": True, "mlp_bias": True}, "native")],
)
def test_configs_a_forward_serves_exactly_register(store, tiny_llama, changes, kind):
    from aieng.store.introspect import inspect_folder

    assert inspect_folder(edit_config(tiny_llama, **changes)).serving == kind
    assert store.register(tiny_llama, "tiny", "1").architecture == "LlamaForCausalLM"


def test_aieng_model_register_exits_non_zero_with_the_reason_and_no_version(tmp_path, tiny_llama):
    edit_config(tiny_llama, rope_parameters=LONGROPE_PAST_ITS_THRESHOLD)
    store = tmp_path / "store"
    result = aieng("model", "register", tiny_llama, "--name", "tiny", "--version", "1", store=store)
    assert result.returncode == 1
    assert result.stderr.startswith("aieng: error: ") and result.stderr.strip().count("\n") == 0
    assert "cannot be served exactly" in result.stderr and "longrope" in result.stderr
    assert not (store / "tiny").exists()
