"""Suite files the tests write: a model with no labels has a suite of prompts only."""

from pathlib import Path

import yaml

QUESTIONS = ("reverse: egg oak van", "sort: pen oak ice", "add: 12+7", "json: name=moon", "reverse: tree ice")


def write_prompts_only_suite(path: Path, questions=QUESTIONS) -> Path:
    """A chat suite without a single assertion: judged only by agreement with another version."""
    suite = {
        "format": "aieng-suite/1",
        "name": "prompts-only",
        "version": 1,
        "defaults": {"max_tokens": 16},
        "cases": [
            {"id": f"q{i}", "family": "chat", "messages": [{"role": "user", "content": q}]}
            for i, q in enumerate(questions)
        ],
    }
    path.write_text(yaml.safe_dump(suite))
    return path
