"""Every supported configuration exact, every other one refused by name.

One test per row of ``aieng.engine.serving_table`` (the table in docs/models.md): a row
served by a forward gives, on a random-weight model of exactly its config, the tokens
transformers' ``generate()`` gives (greedy, fp32, eager, five prompts of different lengths
joining at different steps and leaving at their own limits), and ``generate()`` answers each
prompt alone as it does in that left-padded batch; a refused row is refused by the engine with
its reason. Register's refusal is tested in tests/store/test_register_serving.py, the
paths over HTTP in test_served_architectures.py.
"""

import re
from pathlib import Path

import pytest

from aieng.engine import Engine, EngineConfig
from aieng.engine.serving_path import serving_path
from aieng.engine.serving_table import ROWS, Row, row_config, serving_markdown_table
from aieng.errors import AiengError

from .architectures import MAX_TOKENS, PROMPTS, build_row_model, generate_alone, load, parity

RUNNERS = {"native": "NativeRunner", "transformers": "HFRunner"}
SERVED = [row for row in ROWS if row.kind != "refused"]
REFUSED = [row for row in ROWS if row.kind == "refused"]


def _id(row) -> str:
    return f"{row.model_type}: {row.configuration}"


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Models this small gain nothing from a second thread, and on shared cores the threads' spin
    waits made the module several times slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer(tiny_shape_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_row_of_the_table_is_what_serving_path_decides(row):
    assert serving_path(row_config(row)).kind == row.kind


def test_the_table_in_the_architecture_doc_is_the_generated_one():
    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    block = re.search(r"<!-- serving-table[^>]*-->\n(.*?)\n<!-- /serving-table -->", text, re.S)
    assert block, "docs/models.md has no serving-table block"
    assert block.group(1) == serving_markdown_table(), "regenerate it: python -m aieng.engine.serving_table"


@pytest.fixture(scope="module")
def results(tokenizer, tmp_path_factory):
    """``results(row)``: (runner, the engine's tokens, generate()'s tokens), computed once per row."""
    cache = {}

    def result(row):
        if _id(row) not in cache:
            folder = build_row_model(row, tmp_path_factory.mktemp("row") / "model", tokenizer)
            cache[_id(row)] = parity(*load(folder))
        return cache[_id(row)]

    return result


@pytest.mark.parametrize("row", SERVED, ids=_id)
def test_each_served_row_gives_generate_s_greedy_tokens(row, results):
    engine, ours, theirs = results(row)
    assert type(engine.runner).__name__ == RUNNERS[row.kind]
    assert ours == theirs
    assert len({token for tokens in theirs for token in tokens}) > 10, "a degenerate model would prove little"


@pytest.mark.parametrize("row", SERVED, ids=_id)
def test_each_served_row_answers_alone_as_it_does_left_padded_in_a_batch(row, results):
    """generate() on each prompt by itself gives what it gives left-padded beside the others: the
    model's answer does not depend on its padding or batch-mates (a forward whose masks or
    positions, or whose MoE routing, moved with the batch would fail here, and the parity above
    would only show that the engine repeats it)."""
    engine, _, theirs = results(row)
    assert generate_alone(engine.model, engine, [engine.encode(p) for p in PROMPTS], MAX_TOKENS) == theirs


#: Options that are, by design, the plain model's math within the served context.
SAME_AS_PLAIN = ("rope dynamic", "sliding window >= context")


@pytest.mark.parametrize("row", [r for r in SERVED if r.overrides], ids=_id)
def test_each_option_changes_generate_s_answer(row, results):
    """Same seed, same weight shapes where the option allows: the option itself must change
    generate()'s tokens, or the parity test above would not notice a forward that ignored it."""
    plain = next(r for r in SERVED if r.model_type == row.model_type and not r.overrides)
    if row.configuration.startswith(SAME_AS_PLAIN):
        assert results(row)[2] == results(plain)[2]
    else:
        assert results(row)[2] != results(plain)[2]


@pytest.mark.parametrize("row", REFUSED, ids=_id)
def test_the_engine_refuses_a_refused_row_with_its_reason(row, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(
        row_config(
            row, vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
    )
    with pytest.raises(AiengError, match=re.escape(serving_path(row_config(row)).reason)) as caught:
        Engine(model, tokenizer, config=EngineConfig(compile=False))
    assert caught.value.code == "unsupported_model"


def test_a_context_past_the_dynamic_rope_threshold_is_refused():
    """Dynamic NTK frequencies stay fixed up to max_position_embeddings and grow past it."""
    row = next(r for r in ROWS if "dynamic" in r.configuration)
    config = row_config(row)
    assert serving_path(config, context_length=config.max_position_embeddings).kind == "native"
    refused = serving_path(config, context_length=config.max_position_embeddings + 1)
    assert refused.refused and "dynamic" in refused.reason


def test_a_window_at_least_the_context_is_full_attention_and_a_narrower_one_is_not():
    row = next(r for r in ROWS if r.model_type == "mistral" and r.kind == "native" and r.overrides)
    config = row_config(row)
    assert serving_path(config, context_length=256).kind == "native"
    assert serving_path(config, context_length=257).kind == "transformers"


def test_the_compiled_native_stack_carries_every_bias(tokenizer, tmp_path):
    """Decode steps run the compiled decoder-layer region, whose flat arguments carry the biases."""
    row = Row("llama", "attention and MLP biases", "native", {"attention_bias": True, "mlp_bias": True})
    engine, ours, theirs = parity(*load(build_row_model(row, tmp_path / "model", tokenizer)), compile=True)
    assert ours == theirs
    assert engine.compiled and engine.stats["compile_fallbacks"] == 0
    assert sum(n for graph, n in engine.runner.steps_by_graph.items() if graph is not None) > 10


def test_the_engine_refuses_a_multimodal_checkpoint_before_reading_its_config(tokenizer):
    """A vision-language checkpoint keeps its text model's sizes under ``text_config``: the engine
    must refuse it by name, not fail on a missing ``vocab_size`` first."""
    import torch
    from transformers import Gemma3Config

    model = torch.nn.Linear(2, 2)
    model.config = Gemma3Config()
    with pytest.raises(AiengError, match="text-only causal LMs") as caught:
        Engine(model, tokenizer, config=EngineConfig(compile=False))
    assert caught.value.code == "unsupported_model"
