"""Shared fixtures: the full demo model (built once and cached) and a tiny one (seconds); the
session's one real server and in-process apps; and the cost tier of every test.

Heavy imports (torch, transformers) happen inside the fixtures so that test collection stays
fast for suites that never touch a model.

Cost tiers (``pytest_collection_modifyitems`` below): every collected test gets exactly one of
``unit`` (no model, no server), ``model`` (builds or loads a model, in this process), ``server``
(starts a real ``aieng serve`` process, or uses the session's) and ``notebook`` (an nbval cell, or
a runbook executed with papermill: a kernel runs a notebook), from what it uses: a fixture of
``SERVER_FIXTURES`` or ``MODEL_FIXTURES`` anywhere in its fixture closure, or a call of
``TIER_CALLS`` in its own code or in the code of a fixture it uses. A tier marker written on the
test wins when it is higher; the order is notebook > server > model > unit. ``perf`` is not a
tier: it is written by hand on a test that asserts a timing or throughput bound, beside its
tier. ``make test-fast`` runs
``-m "not server and not notebook and not perf"``; tests/project/test_tiers.py checks the tiers.
"""

from __future__ import annotations

import atexit
import functools
import gc
import inspect
import json
import os
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from .machine_share import machine

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Where the session builds the full demo model when nothing else provides one (git-ignored).
DEMO_CACHE_DIR = REPO_ROOT / "var" / "cache" / "demo-model"
#: A model the local store already serves, preferred over building one.
STORE_DEMO_DIR = REPO_ROOT / "var" / "store" / "demo" / "current"


def _cache_is_current(path: Path) -> bool:
    """True when ``path`` holds a complete build made with today's default config."""
    from aieng.demo.build import BUILD_INFO_FILE, MODEL_FILES, RECIPE_VERSION, DemoBuildConfig
    from aieng.evaluation.suite_file import SUITE_FILE

    if not all((path / name).is_file() for name in (*MODEL_FILES, BUILD_INFO_FILE, SUITE_FILE)):
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


@pytest.fixture
def tiny_two_versions(tmp_path, tiny_demo_dir):
    """A store of the tiny model as demo@1 (current) and demo@2: release records, no server."""
    from aieng.store import ModelStore

    store = ModelStore(tmp_path / "store")
    for version in ("1", "2"):
        store.register(tiny_demo_dir, "demo", version)
    store.promote("demo", "1")
    return store


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


@pytest.fixture(scope="session")
def tiny_bf16_model_dir(tmp_path_factory) -> Path:
    """The ``tiny-wide-vocab`` shape: the tiny shape stored in bf16, as most real checkpoints are."""
    from aieng.demo.shapes import build_shape_model

    return build_shape_model(tmp_path_factory.mktemp("tiny-bf16") / "model", "tiny-wide-vocab", seed=0)


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
        procs.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'data'}",
                    f"--web.listen-address={url.split('://')[1]}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
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


# -- the session's real server and in-process apps ------------------------------------------------


@pytest.fixture(scope="session")
def session_store(tmp_path_factory, demo_model_dir):
    """A store serving the full demo model as demo@1 (current) for the whole session. Nothing
    may change it: the session's server and in-process apps serve it to every test that reads."""
    from aieng.store import ModelStore

    store = ModelStore(tmp_path_factory.mktemp("session-store"))
    store.register(demo_model_dir, "demo", "1")
    store.promote("demo", "1")
    return store


@pytest.fixture(scope="session")
def shared_server(session_store):
    """ONE real 2-worker ``aieng serve`` for every test that only reads over HTTP (routes' real
    framing, streams and disconnects, the openai client, logs, metrics, load tools): started on
    first use, stopped when the session ends. A test that changes the server (a swap, a kill, a
    setting) starts its own process instead; one whose subject is not the process uses
    ``inprocess`` below. Its output (``shared_server.output()``) holds every test's lines: find
    yours by trace id or take the lines after your request."""
    from aieng.bench.server_process import ServerProcess

    with ServerProcess(store=session_store.root, model="demo", extra_args=["--workers", "2"]) as proc:
        yield proc


@pytest.fixture(scope="session")
def inprocess():
    """``start(store_root, model="demo", **settings) -> TestClient``: ``create_app`` over a
    ``Runtime`` built in this process (verify, load, engine, warm-up, engine thread: what a worker
    does, without gunicorn or a socket; the worker plan is logged, not applied), driven by
    Starlette's ``TestClient`` held open for the session, so that every request runs on one event
    loop (its portal thread) as in a worker, and the app's bridge sees one loop. Responses come
    back whole; client disconnects need a socket and so a real server. ``settings`` are
    ``Settings`` fields on top of the environment's, as ``aieng serve`` reads them; compilation
    is off and the store is not polled. The client has ``.runtime``; leaving the client at the end
    of the session runs the app's lifespan exit, which stops the runtime."""
    from starlette.testclient import TestClient

    from aieng.server.http.app import create_app
    from aieng.server.process.runtime import Runtime, RuntimeConfig
    from aieng.server.process.worker_plan import plan_for_model
    from aieng.settings import Settings

    started = []

    def start(store_root, model: str = "demo", **settings):
        chosen = Settings.from_env(
            **{"compile": False, "reload_poll_s": 0.0, **settings, "store": Path(store_root), "model": model}
        )
        runtime = Runtime(RuntimeConfig.from_settings(chosen))
        runtime.prepare()
        gc.unfreeze()  # prepare() freezes what it loaded for fork's sake; this process does not fork
        # logged with the engine's choices (serving_plan) as in aieng serve; its thread count is not
        # applied: torch's threads are this test process's
        runtime.worker_plan = plan_for_model(chosen, runtime.loaded)
        runtime.start(background_warmup=False)
        app = create_app(
            runtime, max_body_bytes=chosen.max_body_bytes, body_timeout_s=chosen.body_timeout_s, start_runtime=False
        )
        client = TestClient(app, base_url="http://aieng.inprocess").__enter__()  # one portal (loop) from here on
        client.runtime = runtime
        started.append(client)
        return client

    yield start
    for client in started:
        client.__exit__(None, None, None)


@pytest.fixture(scope="session")
def inprocess_demo(inprocess, session_store):
    """The demo model's app with default settings, in this process (``inprocess``), for the session."""
    return inprocess(session_store.root)


# -- cost tiers -----------------------------------------------------------------------------------

TIERS = ("unit", "model", "server", "notebook")  # cheapest first; the highest that applies wins
#: Fixtures that start a real server process (or hand out the session's).
SERVER_FIXTURES = frozenset(
    {"shared_server", "server", "two_workers", "strict_server", "live_server", "prometheus", "balancer"}
)
#: Fixtures that build or load a model (weights, a tokenizer built for one, an engine on one).
MODEL_FIXTURES = frozenset(
    {
        "demo_model_dir",
        "tiny_demo_dir",
        "tiny_shape_model_dir",
        "tiny_bf16_model_dir",
        "demo_store",
        "session_store",
        "inprocess",
        "inprocess_demo",
        "demo",
        "qwen",
        "engine",
        "real_model_dirs",
        "real_tokenizer",
        "tiny_llama",
        "_tiny_llama_template",
    }
)
#: Calls that put a test in a tier when the test or one of its fixtures makes them itself: a real
#: server started; a runbook executed with papermill (``aieng.workbook.runbooks.execute("name",
#: ...)``: a notebook run in a kernel); a model built or loaded.
TIER_CALLS = {
    "server": re.compile(r"\bServerProcess\("),
    "notebook": re.compile(r"\bexecute\(\s*\""),
    "model": re.compile(
        r"\b(?:from_pretrained|ForCausalLM|build_demo_model|build_shape_model|load_version|"
        r"make_tiny_llama|build_row_model|evaluate_dir)\("
    ),
}


@functools.cache
def _tiers_called(function) -> frozenset[str]:
    """The tiers of the calls in ``function``'s own code (cached: one fixture serves many tests)."""
    try:
        code = inspect.getsource(function)
    except (OSError, TypeError):
        return frozenset()
    return frozenset(tier for tier, calls in TIER_CALLS.items() if calls.search(code))


def cost_tier(item) -> str:
    """The one tier of ``item``: the highest of its own tier markers and what it uses."""
    if type(item).__name__ == "IPyNbCell":
        return "notebook"
    found = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    names = set(getattr(item, "fixturenames", ()))
    found |= _tiers_called(getattr(item, "function", None))
    info = getattr(item, "_fixtureinfo", None)
    for name in names:
        for fixturedef in info.name2fixturedefs.get(name, ()) if info else ():
            found |= _tiers_called(fixturedef.func)
    if names & SERVER_FIXTURES:
        found.add("server")
    if names & MODEL_FIXTURES:
        found.add("model")
    return max(found, key=TIERS.index, default="unit")


_TIER_ROWS = pytest.StashKey[list]()


def costliest_files_first(items: list, tiers: dict[str, str]) -> None:
    """Order the files by the highest tier of their tests, costliest first, each file's tests kept
    together and in order. Under ``-n 2 --dist loadfile`` a worker takes whole files in this order,
    so the long files (the book, the release runbooks, the servers) start at once and the short
    ones fill the gaps at the end, instead of one long file running alone on one core at the end.
    """
    rank: dict[str, int] = {}  # file -> its costliest tier's index
    for item in items:
        file = item.nodeid.split("::")[0]
        rank[file] = max(rank.get(file, 0), TIERS.index(tiers[item.nodeid]))
    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-rank[item.nodeid.split("::")[0]], position[id(item)]))


def pytest_collection_modifyitems(config, items):
    """Runs before ``-m`` deselects: the markers it adds are what ``-m`` selects on."""
    tiers = {}
    for item in items:
        tier = tiers[item.nodeid] = cost_tier(item)
        if not any(mark.name == tier for mark in item.iter_markers()):
            item.add_marker(tier)
    costliest_files_first(items, tiers)
    rows = [
        {
            "nodeid": item.nodeid,
            "tiers": sorted({m.name for m in item.iter_markers() if m.name in TIERS}),
            "perf": item.get_closest_marker("perf") is not None,
            "alone": runs_alone(item),
        }
        for item in items
    ]
    config.stash[_TIER_ROWS] = rows
    report = os.environ.get("AIENG_TIERS_REPORT")  # a collection run of tests/project/test_tiers.py
    if report:
        Path(report).write_text(json.dumps(rows))


@pytest.fixture(scope="session")
def collected_tiers(request) -> list[dict]:
    """What this session collected, before ``-m`` deselected any: nodeid, tiers, perf."""
    return request.config.stash.get(_TIER_ROWS, [])


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs two workers, ``make test-fast`` one per core) each
    worker gets one torch thread, since workers of several threads each on shared cores meet at
    torch's barriers and wait on each other, and claims its share of the machine per test (below).

    So do the processes a worker starts (``OMP_NUM_THREADS``): notebook and runbook kernels, CLI
    runs: a lesson's in-kernel evaluation at two threads beside the other worker waits at every
    barrier (notebook 07's, beside one busy core; the commit that set this has the figures).
    Servers set their own count from their worker plan, so they run as ``aieng serve`` runs them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)
    if hasattr(config, "workerinput"):  # an xdist worker (not a pytest run it started)
        machine.configure(config.workerinput["testrunuid"])


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """An xdist worker ends here, once its results are sent (``workerfinished``, at session end).

    After a session of compiled graphs the interpreter's own teardown (freeing every graph, guard
    and kernel wrapper one object at a time) takes seconds, which the controller waits through
    before it can report. The exit handlers still run (pytest's temp-folder locks, anything a test
    registered); only that teardown is skipped."""
    if hasattr(config, "workerinput"):
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def runs_alone(item) -> bool:
    """A test that asserts a timing bound (``perf``) runs alone, unless it only judges what a
    fixture measured already (``perf(alone=False)``: alone, or beside the other worker with a
    bound that allows for it): waiting for the machine then buys nothing."""
    perf = item.get_closest_marker("perf")
    return perf is not None and perf.kwargs.get("alone", True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Setup, call and teardown under a shared claim on the machine, or alone for a test that
    asserts a timing bound (``runs_alone``): tests/machine_share.py."""
    with machine.alone() if runs_alone(item) else machine.shared():
        yield
