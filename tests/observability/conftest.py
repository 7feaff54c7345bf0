import pytest

from aieng.bench.server_process import ServerProcess


@pytest.fixture(scope="module")
def two_workers(demo_store):
    with ServerProcess(store=demo_store.root, extra_args=["--workers", "2"]) as proc:
        yield proc
