"""Each serving path through the served app: a model registered in a store, served by the runtime
and app ``aieng serve`` runs (in this process: ``inprocess``, tests/conftest.py), its greedy
answers over the HTTP routes equal to transformers' ``generate()``.

One app per path: the native forward on a Llama with attention and MLP biases (the
configuration it used to answer wrongly without a word), the transformers forward on GPT-2.
Prompts go in as concurrent requests with different ``max_tokens``, so rows join and leave the
server's batch at different steps.
"""

import json
import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from aieng.engine.hf_model import pad_token_id
from aieng.engine.reference import reference_greedy
from aieng.engine.serving_table import ROWS, Row
from aieng.model_facts import eos_token_ids

from ..command import aieng
from .architectures import MAX_TOKENS, PROMPTS, build_row_model, load

CASES = {
    "native": Row("llama", "attention and MLP biases", "native", {"attention_bias": True, "mlp_bias": True}),
    "transformers": next(row for row in ROWS if row.model_type == "gpt2"),
}


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny_shape_model_dir):
    from transformers import AutoTokenizer

    from aieng.store import ModelStore

    tokenizer = AutoTokenizer.from_pretrained(tiny_shape_model_dir, local_files_only=True)
    store = ModelStore(tmp_path_factory.mktemp("architectures-store"))
    for name, row in CASES.items():
        folder = build_row_model(row, tmp_path_factory.mktemp(name) / "model", tokenizer)
        store.register(folder, name, "1")
        store.promote(name, "1")
    return store


def expected(folder):
    """generate()'s answer per prompt as the server renders it: text, and why it ended."""
    model, tokenizer = load(folder)
    eos = eos_token_ids(model, tokenizer)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    rows = reference_greedy(
        model, ids, max_new_tokens=max(MAX_TOKENS), eos_ids=eos, pad_id=pad_token_id(tokenizer, eos)
    )
    answers = []
    for row, limit in zip(rows, MAX_TOKENS):
        row = row[:limit]
        text = tokenizer.decode(list(row), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        answers.append((text, "stop" if row[-1] in eos else "length"))
    return answers


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", list(CASES))
def test_the_served_greedy_answer_is_generate_s(path, store, inprocess, caplog):
    caplog.set_level(logging.INFO)
    folder = store.version_dir(path, "1")
    client = inprocess(store.root, path, workers="1")  # compile off, as in every in-process app

    def ask(i: int):
        body = {"model": path, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i], "temperature": 0}
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
        return choice["text"], choice["finish_reason"]

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, range(len(PROMPTS))))
    events = {getattr(record, "event", None): record for record in caplog.records}
    assert answers == expected(folder)
    assert any(r.getMessage().startswith("serving with the transformers forward") for r in caplog.records) == (
        path == "transformers"
    )
    assert ("engine_kv_cache" in events) == (path == "native")  # the native runner's static cache
    chosen = events["serving_plan"]
    assert chosen.runner == path and chosen.workers == 1 and chosen.compile.startswith("off")


@pytest.mark.parametrize("path", list(CASES))
def test_model_inspect_says_which_forward_and_why_without_serving(path, store):
    env = {"AIENG_COMPILE": "0", "AIENG_WEIGHT_FORMATS": "float32"}
    result = aieng("model", "inspect", path, "--json", store=store.root, env=env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["runner"] == path and plan["version"] == "1" and plan["workers"] >= 1
    if path == "native":
        assert plan["runner_why"] == "the native forward implements every option of this config"
        assert (
            plan["weights"].startswith("fp32 weights for every step")
            and "AIENG_WEIGHT_FORMATS=float32" in plan["weights"]
        )
        assert " rows x " in plan["kv_cache"] and plan["kv_cache_why"].startswith("AIENG_KV_CACHE_DTYPE=auto")
    else:
        assert "gpt2 is not of the Llama family" in plan["runner_why"] and "dynamic cache" in plan["kv_cache"]
    text = aieng("model", "inspect", f"{path}@1", store=store.root, env=env)
    assert text.returncode == 0 and text.stdout.splitlines()[2].startswith(f"forward          {path}: ")
    missing = aieng("model", "inspect", f"{path}@7", store=store.root, env=env)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
