"""Engine fixtures: the demo model (real, trained) and a random tiny Qwen2 (a second architecture)."""

from __future__ import annotations

import pytest
import torch

from aieng.engine import Engine, EngineConfig
from aieng.engine.chat import user_prompt


@pytest.fixture(scope="session")
def demo(demo_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    return model, tokenizer


@pytest.fixture(scope="session")
def qwen(demo):
    """A randomly initialised Qwen2 sharing the demo tokenizer: proves the loop is not demo-specific."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, tokenizer = demo
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


@pytest.fixture(scope="session")
def render(demo):
    _, tokenizer = demo

    return lambda message: user_prompt(tokenizer, message)


@pytest.fixture(params=[EngineConfig(compile=False), EngineConfig(compile=False, native=False)], ids=["native", "hf"])
def engine(request, demo):
    """An eager engine on the demo model, once per runner: the native forward and transformers'."""
    model, tokenizer = demo
    return Engine(model, tokenizer, config=request.param)


def run_until_idle(engine, requests, *, after_first=None):
    """Every event until all rows finish; ``after_first(engine)`` runs once the rows are in."""
    events = engine.step(requests).events
    if after_first is not None:
        after_first(engine)
    while engine.num_running:
        events += engine.step().events
    return events


@pytest.fixture(scope="module")
def built():
    """aieng's CPU kernels, built and loaded: this machine has the compiler torch.compile needs."""
    from aieng.engine.native import kernels

    reason = kernels.load()
    assert reason is None, reason


@pytest.fixture
def quantized_wins(monkeypatch):
    """A quantised format taken whatever the plan's race says: on models this small none saves the bar."""
    from aieng.engine.native import formats

    monkeypatch.setattr(formats, "quantized_wins", lambda float_s, quantized_s: True)
