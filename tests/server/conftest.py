"""A real server on a free loopback port, serving the demo model from a temporary store."""

from __future__ import annotations

import pytest

from aieng.server.launcher import ServerProcess
from aieng.store import ModelStore


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, demo_model_dir):
    store = ModelStore(tmp_path_factory.mktemp("server-store"))
    store.register(demo_model_dir, "demo", "1")
    store.promote("demo", "1")
    return store


@pytest.fixture(scope="module")
def server(demo_store):
    with ServerProcess(store=demo_store.root, model="demo") as proc:
        yield proc
