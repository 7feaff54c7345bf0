"""Seeing what the service does: JSON logs keyed by trace id, and Prometheus metrics that stay
correct across gunicorn workers (``aieng.observability.metrics`` holds the metric definitions)."""
