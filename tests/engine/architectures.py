"""Tiny random-weight models, one per row of ``aieng.engine.serving_table``, and the greedy-parity
check every served row must pass: the engine's tokens, rows joining and leaving mid-decode, equal
to transformers' ``generate()`` on the same prompts batched together.

Each model is a real folder (``save_pretrained`` plus the demo tokenizer), so the same builder
serves the in-process parity tests, the HTTP tests and the store's refusal tests.
"""

from __future__ import annotations

from pathlib import Path

import torch

from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from aieng.engine.reference import reference_greedy
from aieng.engine.serving_table import Row, row_config

PROMPTS = [
    "reverse: apple stone river",
    "add: 27+58",
    "json: name=ana age=31 city=oslo",
    "sort: river apple stone boat door glass milk",
    "reverse: " + " ".join(["stone"] * 12),
]
#: Per prompt, so rows leave at different steps (and the longest outlives every window of 8).
MAX_TOKENS = [14, 9, 18, 11, 16]


#: The weights' spread. At transformers' default (0.02) a two-layer random model's greedy answer
#: hardly depends on the rotary variant (linear, llama3, yarn gave the plain model's tokens): a
#: forward that ignored the scaling would pass. At this spread every option changes the tokens
#: (``test_each_option_changes_generate_s_answer`` holds that), and no near-ties show up.
INIT_RANGE = 0.3


def build_row_model(row: Row, folder: Path, tokenizer, *, seed: int = 0) -> Path:
    """Save a random model of ``row``'s config. Biases and norm weights are randomised too:
    transformers initialises biases to zero and norms to one, and a forward that dropped a zero
    bias (or a norm of ones) would pass any comparison."""
    from transformers import AutoModelForCausalLM

    config = row_config(
        row,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=INIT_RANGE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.normal_(0.0, INIT_RANGE)
                elif "norm" in name or ".ln" in name or "layernorm" in name:
                    param.add_(torch.randn_like(param) * 0.1)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load(folder: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


#: How many prompts join at each step: two together (prefilled as one left-padded group on the
#: transformers path), then one at a time while the first rows decode, then two more.
JOINS = {0: 2, 2: 1, 3: 2}


def staggered_greedy(engine: Engine, prompt_ids: list[list[int]], max_tokens: list[int]) -> list[tuple[int, ...]]:
    """Greedy tokens per prompt with rows joining at different steps (``JOINS``), so prompts
    prefill (in chunks, on the native path) beside rows already decoding, and rows leave at their
    own ``max_tokens`` (or EOS) while the others go on."""
    requests = [
        GenerationRequest(str(i), ids, SamplingParams(max_tokens=n, temperature=0))
        for i, (ids, n) in enumerate(zip(prompt_ids, max_tokens))
    ]
    produced: dict[str, list[int]] = {r.request_id: [] for r in requests}
    pending, step = list(requests), 0
    while pending or engine.num_running:
        joiners, pending = pending[: JOINS.get(step, 0)], pending[JOINS.get(step, 0) :]
        for event in engine.step(joiners).events:
            produced[event.request_id].append(event.token_id)
        step += 1
    assert engine.runner.decoding_ids() == []
    return [tuple(produced[r.request_id]) for r in requests]


def generate_reference(model, engine: Engine, prompt_ids: list[list[int]], max_tokens: list[int]):
    """transformers' generate() on all prompts at once (left-padded), each cut to its own limit."""
    rows = reference_greedy(
        model, prompt_ids, max_new_tokens=max(max_tokens), eos_ids=engine.eos_ids, pad_id=engine.pad_id
    )
    return [row[:n] for row, n in zip(rows, max_tokens)]


def generate_alone(model, engine: Engine, prompt_ids: list[list[int]], max_tokens: list[int]):
    """transformers' generate() on each prompt by itself (no padding, no batch-mates)."""
    return [
        reference_greedy(model, [ids], max_new_tokens=n, eos_ids=engine.eos_ids, pad_id=engine.pad_id)[0]
        for ids, n in zip(prompt_ids, max_tokens)
    ]


def parity(model, tokenizer, *, compile: bool = False) -> tuple[Engine, list, list]:
    """(the engine, its tokens, generate()'s tokens) for ``PROMPTS``; prompts prefill in chunks of
    at most 4 tokens on the native path. Compiled: warmed up first, as a server does."""
    engine = Engine(model, tokenizer, config=EngineConfig.exact(compile=compile, prefill_chunk_tokens=4))
    if compile:
        engine.warmup()
    ids = [engine.encode(p) for p in PROMPTS]
    ours = staggered_greedy(engine, ids, MAX_TOKENS)
    return engine, ours, generate_reference(model, engine, ids, MAX_TOKENS)
