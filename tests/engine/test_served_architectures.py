"""Each serving path over real HTTP: a model registered in a store, served by ``aieng serve`` on a
loopback port, its greedy answers equal to transformers' ``generate()``.

One server per path: the native forward on a Llama with attention and MLP biases (the
configuration it used to answer wrongly without a word), the transformers forward on GPT-2.
Prompts go in as concurrent requests with different ``max_tokens``, so rows join and leave the
server's batch at different steps.
"""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from aieng.bench.server_process import ServerProcess
from aieng.engine.hf_model import pad_token_id
from aieng.engine.reference import reference_greedy
from aieng.engine.serving_table import ROWS, Row
from aieng.model_facts import eos_token_ids

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
    rows = reference_greedy(model, ids, max_new_tokens=max(MAX_TOKENS), eos_ids=eos, pad_id=pad_token_id(tokenizer, eos))
    answers = []
    for row, limit in zip(rows, MAX_TOKENS):
        row = row[:limit]
        text = tokenizer.decode(list(row), skip_special_tokens=True, clean_up_tokenization_spaces=False)
        answers.append((text, "stop" if row[-1] in eos else "length"))
    return answers


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", list(CASES))
def test_the_served_greedy_answer_is_generate_s(path, store):
    folder = store.version_dir(path, "1")
    with ServerProcess(store=store.root, model=path, extra_args=["--workers", "1", "--no-compile"]) as server:
        def ask(i: int):
            body = {"model": path, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS[i], "temperature": 0}
            choice = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]
            return choice["text"], choice["finish_reason"]

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = list(pool.map(ask, range(len(PROMPTS))))
        log = server.output()
    assert answers == expected(folder)
    assert ("serving with the transformers forward" in log) == (path == "transformers")
    assert ("KV cache:" in log) == (path == "native")  # the native runner's static cache
