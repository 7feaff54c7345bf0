"""A worker's memory gauges are set when its app starts, not only on its first scrape or step.

``aieng_process_resident_memory_bytes`` is summed over the live workers (livesum): a worker that
no request and no scrape has reached yet would otherwise be missing from the sum, and a later
look that counts it reads as growth (the load test's ``rss_growth`` check saw one worker, then two).
"""

import psutil
from starlette.testclient import TestClient

from aieng.observability import metrics
from aieng.server.http.app import create_app
from aieng.server.process.runtime import Runtime, RuntimeConfig
from aieng.settings import Settings


def test_starting_the_app_sets_this_process_resident_memory_before_any_request():
    metrics.PROCESS_RESIDENT.set(0)
    app = create_app(Runtime(RuntimeConfig(settings=Settings())), start_runtime=False)
    with TestClient(app):  # runs the lifespan; sends nothing
        published = metrics.PROCESS_RESIDENT._value.get()
    assert 0.5 < published / psutil.Process().memory_info().rss < 2.0
