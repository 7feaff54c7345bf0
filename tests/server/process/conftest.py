"""A store with demo@1 (current) and demo@2, and a 2-worker server on it with admin routes: what
the hot-swap and canary tests run against (one of each per test module).

The server serves eagerly unless a module asks for the compiled stack (``server_args``): these
modules judge the release mechanics (canaries, runbooks, dashboards), which are the same either
way, and a compiled start costs a warm-cache trace of every graph. ``test_hot_swap`` compiles,
because a successor sharing its predecessor's graphs under load is part of what it judges."""

import pytest

from aieng.bench.server_process import ServerProcess
from aieng.store import ModelStore

ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def store(tmp_path_factory, demo_model_dir):
    store = ModelStore(tmp_path_factory.mktemp("two-versions"))
    for version in ("1", "2"):
        store.register(demo_model_dir, "demo", version)
    store.promote("demo", "1")
    return store


@pytest.fixture(scope="module")
def reload_poll_s() -> str:
    return "0.5"


@pytest.fixture(scope="module")
def server_env() -> dict:
    return {}


@pytest.fixture(scope="module")
def server_args() -> list[str]:
    return ["--workers", "2", "--no-compile"]


@pytest.fixture(scope="module")
def server(store, reload_poll_s, server_env, server_args):
    env = {"AIENG_ADMIN_TOKEN": ADMIN_TOKEN, "AIENG_RELOAD_POLL_S": reload_poll_s, **server_env}
    with ServerProcess(store=store.root, extra_args=server_args, env=env) as proc:
        yield proc
