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


@pytest.fixture
def prometheus(tmp_path):
    """``start(server_url) -> prometheus_url``: a real Prometheus (the project's scrape config and
    alert rules, scraping every second) on a free port, stopped after the test. Skips without the
    binary (Debian package ``prometheus``; ``.ci/run`` installs it)."""
    import shutil
    import subprocess
    import time

    import httpx

    from aieng.bench.server_process import free_port

    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus binary is absent (Debian package `prometheus`; .ci/run installs it)")
    deploy = Path(__file__).resolve().parents[1] / "deploy/prometheus"
    procs = []

    def start(server_url: str) -> str:
        config = (deploy / "prometheus.yml").read_text().replace("scrape_interval: 15s", "scrape_interval: 1s")
        (tmp_path / "prometheus.yml").write_text(config.replace("127.0.0.1:8000", server_url.split("://")[-1]))
        shutil.copy(deploy / "alerts.yml", tmp_path / "alerts.yml")
        url = f"http://127.0.0.1:{free_port()}"
        procs.append(subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'data'}",
                                       f"--web.listen-address={url.split('://')[1]}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # ready, and has scraped the target at least once
            try:
                up = httpx.get(f"{url}/api/v1/query", params={"query": "up"}, timeout=2).json()["data"]["result"]
                if up and up[0]["value"][1] == "1":
                    return url
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"Prometheus at {url} did not scrape {server_url} within 60 s")

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(20)
