"""prometheus_client multiprocess mode for gunicorn workers.

Each worker writes its samples to mmap files in ``PROMETHEUS_MULTIPROC_DIR``; ``/metrics`` on any
worker merges them, so counters and histograms add up across workers. The variable must be set
before ``prometheus_client`` is imported (it picks its value class at import), which is why
``aieng serve`` prepares the directory first thing. The master removes it at exit; a dead
worker's live gauges are dropped by the ``child_exit`` hook (its counters stay: they happened).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir() -> Path:
    """Create (or empty) the directory and export it. Must run before prometheus_client is imported."""
    if "prometheus_client" in sys.modules and not os.environ.get(ENV):
        raise RuntimeError("prometheus_client was imported before the multiprocess directory was set")
    configured = os.environ.get(ENV)
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):  # samples of an earlier run must not be merged into ours
            stale.unlink()
        return path
    path = Path(tempfile.mkdtemp(prefix="aieng-prometheus-"))
    os.environ[ENV] = str(path)
    owner = os.getpid()

    def cleanup() -> None:
        if os.getpid() == owner:  # forked workers inherit atexit handlers; only the master cleans
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(cleanup)
    return path


def metrics_text() -> tuple[bytes, str]:
    """The exposition for /metrics: merged across workers in multiprocess mode."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def mark_worker_dead(pid: int) -> None:
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)
