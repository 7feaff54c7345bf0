"""Prometheus metrics. Names are a public contract: dashboards and alert rules depend on them.

Buckets are chosen for LLM work: loads take seconds to minutes; request latencies run from
milliseconds to tens of seconds.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)

MODEL_LOAD_SECONDS = Histogram(
    "aieng_model_load_seconds", "Time to verify and load a model version, seconds.", ["model"], buckets=LOAD_BUCKETS
)
MODEL_LOAD_ERRORS = Counter(
    "aieng_model_load_errors_total", "Model loads that failed, by error code.", ["model", "code"]
)
MODEL_INFO = Gauge(
    "aieng_model_info", "The model version this process serves (value 1).", ["name", "version", "sha256"]
)
REQUESTS = Counter("aieng_requests_total", "HTTP requests by route and status code.", ["route", "code"])
REQUEST_DURATION = Histogram(
    "aieng_request_duration_seconds", "End-to-end request latency, seconds.", ["route"], buckets=LATENCY_BUCKETS
)
