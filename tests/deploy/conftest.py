"""tests/deploy on sys.path: its modules share manifests.py (rendering, validation, routes)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def render(demo_model_dir):
    """A user message in the demo model's own chat template, as a chat client would send it."""
    from transformers import AutoTokenizer

    from aieng.engine.chat import user_prompt

    tokenizer = AutoTokenizer.from_pretrained(demo_model_dir, local_files_only=True)
    return lambda message: user_prompt(tokenizer, message)
