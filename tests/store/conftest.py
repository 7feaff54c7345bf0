"""Fixtures for store tests: a tiny random Llama folder (milliseconds to make) and an empty store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def make_tiny_llama(folder: Path, *, seed: int = 0, hidden_size: int = 16, vocab_size: int = 64) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def _tiny_llama_template(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture
def tiny_llama(tmp_path, _tiny_llama_template) -> Path:
    """A fresh copy per test, so tests may tamper with it."""
    return Path(shutil.copytree(_tiny_llama_template, tmp_path / "src"))


@pytest.fixture
def store(tmp_path):
    from aieng.store import ModelStore

    return ModelStore(tmp_path / "store")
