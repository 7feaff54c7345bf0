"""Benchmarks that compare side by side in one process and report ratios (``aieng bench ...``)."""
