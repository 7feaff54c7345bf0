"""A real server on a free loopback port, serving the demo model from a temporary store."""

from __future__ import annotations

import pytest

from aieng.bench.server_process import ServerProcess


@pytest.fixture(scope="module")
def server(demo_store):
    with ServerProcess(store=demo_store.root, model="demo") as proc:
        yield proc


@pytest.fixture(scope="module")
def render(demo_model_dir):
    """Render a user message with the demo model's own chat template (what a chat client would send)."""
    from transformers import AutoTokenizer

    from aieng.engine.chat import user_prompt

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    return lambda message: user_prompt(tokenizer, message)
