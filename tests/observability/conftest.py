import pytest

from aieng.server.launcher import ServerProcess
from aieng.store import ModelStore


@pytest.fixture(scope="module")
def obs_store(tmp_path_factory, demo_model_dir):
    store = ModelStore(tmp_path_factory.mktemp("obs-store"))
    store.register(demo_model_dir, "demo", "1")
    store.promote("demo", "1")
    return store


@pytest.fixture(scope="module")
def two_workers(obs_store):
    with ServerProcess(store=obs_store.root, extra_args=["--workers", "2"]) as proc:
        yield proc
