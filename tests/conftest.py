"""Shared fixtures: the full demo model (built once and cached) and a tiny one (seconds).

Heavy imports (torch, transformers) happen inside the fixtures so that test collection stays
fast for suites that never touch a model.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where the session builds the full demo model when nothing else provides one (git-ignored).
DEMO_CACHE_DIR = REPO_ROOT / "var" / "cache" / "demo-model"
#: A model the local store already serves, preferred over building one.
STORE_DEMO_DIR = REPO_ROOT / "var" / "store" / "demo" / "current"


def _cache_is_current(path: Path) -> bool:
    """True when ``path`` holds a complete build made with today's default config."""
    from aieng.demo.build import BUILD_INFO_FILE, MODEL_FILES, RECIPE_VERSION, DemoBuildConfig

    if not all((path / name).is_file() for name in (*MODEL_FILES, BUILD_INFO_FILE)):
        return False
    info = json.loads((path / BUILD_INFO_FILE).read_text())
    defaults = json.loads(json.dumps(asdict(DemoBuildConfig())))
    return info.get("recipe") == RECIPE_VERSION and info.get("config") == defaults


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """The full default demo model.

    In order of preference: ``$AIENG_TEST_DEMO_DIR``; the store's ``demo/current``; the cache
    in ``var/cache/demo-model`` (rebuilt when the default config or recipe changed); else a fresh build
    into that cache (minutes, once per machine).
    """
    env = os.environ.get("AIENG_TEST_DEMO_DIR")
    if env and Path(env).exists():
        return Path(env)
    if STORE_DEMO_DIR.exists():
        return STORE_DEMO_DIR
    if _cache_is_current(DEMO_CACHE_DIR):
        return DEMO_CACHE_DIR
    from aieng.demo.build import DemoBuildConfig, build_demo_model

    if DEMO_CACHE_DIR.exists():
        shutil.rmtree(DEMO_CACHE_DIR)  # stale: built with other defaults
    return build_demo_model(DEMO_CACHE_DIR, DemoBuildConfig(), progress=False)


@pytest.fixture(scope="session")
def tiny_demo_dir(tmp_path_factory) -> Path:
    """A tiny-config demo model (seconds to build): every file, loadable, not accurate."""
    from aieng.demo.build import DemoBuildConfig, build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("tiny-demo") / "model", DemoBuildConfig.tiny(), progress=False)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, demo_model_dir):
    """A temporary store serving the full demo model as demo@1 (current), one per test module."""
    from aieng.store import ModelStore

    store = ModelStore(tmp_path_factory.mktemp("demo-store"))
    store.register(demo_model_dir, "demo", "1")
    store.promote("demo", "1")
    return store


@pytest.fixture(scope="session")
def tiny_shape_model_dir(tmp_path_factory) -> Path:
    """The ``tiny`` shape (aieng.demo.shapes): random weights, 4 heads / 2 KV heads, the demo tokenizer.

    Seconds to build, loadable and registrable like any model; its outputs are noise. For engine
    tests of grouped-query attention and anything that needs a real folder but no accuracy.
    """
    from aieng.demo.shapes import build_shape_model

    return build_shape_model(tmp_path_factory.mktemp("tiny-shape") / "model", "tiny", seed=0)
