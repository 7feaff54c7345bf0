"""The server the HTTP tests read from: the session's one real server (``shared_server``, a
2-worker ``aieng serve`` of demo@1), not one per module. tests/server/process/ overrides
``server`` with a process of its own: there the process is the subject."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server


@pytest.fixture(scope="module")
def render(demo_model_dir):
    """Render a user message with the demo model's own chat template (what a chat client would send)."""
    from transformers import AutoTokenizer

    from aieng.engine.chat import user_prompt

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    return lambda message: user_prompt(tokenizer, message)
