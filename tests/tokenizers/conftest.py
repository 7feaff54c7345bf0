"""Real-shaped tokenizers (``real_tokenizers``): built once per session, served one at a time.

tests/tokenizers is put on sys.path so its modules share ``real_tokenizers`` (the suite imports
test files by path, not as a package).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

KINDS = ("byte_level", "sentencepiece")


@pytest.fixture(scope="session")
def real_model_dirs(tmp_path_factory):
    """``kind -> model folder``, each built on first use (seconds, deterministic, offline)."""
    from real_tokenizers import build

    built: dict[str, Path] = {}

    def folder(kind: str) -> Path:
        if kind not in built:
            built[kind] = build(kind, tmp_path_factory.mktemp(f"tok-{kind}") / "model")
        return built[kind]

    return folder


@pytest.fixture(scope="session")
def real_tokenizer(real_model_dirs):
    """``kind -> tokenizer`` loaded from the built folder, as the server loads it."""
    from transformers import AutoTokenizer

    loaded = {}

    def tokenizer(kind: str):
        if kind not in loaded:
            loaded[kind] = AutoTokenizer.from_pretrained(real_model_dirs(kind), local_files_only=True)
        return loaded[kind]

    return tokenizer
