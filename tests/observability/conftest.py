import pytest


@pytest.fixture(scope="module")
def two_workers(shared_server):
    """A real 2-worker server: the session's (tests/conftest.py), which these tests only read."""
    return shared_server
