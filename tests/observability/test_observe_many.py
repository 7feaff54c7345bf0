"""Bulk histogram observation (inter-token latency) and the windowed tokens/s gauge."""

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Histogram

from aieng.engine import StepResult
from aieng.observability import metrics
from aieng.observability.observer import MetricsObserver


def _samples(histogram_name, registry):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name.startswith(histogram_name)
    }


def test_observe_many_matches_one_observe_per_value():
    values = [0.0001, 0.005, 0.0051, 0.02, 0.02, 0.3, 1.0, 7.5, 99.0, 0.0]
    one_by_one, bulk = CollectorRegistry(), CollectorRegistry()
    a = Histogram("itl", "x", buckets=metrics.LATENCY_BUCKETS, registry=one_by_one)
    b = Histogram("itl", "x", buckets=metrics.LATENCY_BUCKETS, registry=bulk)
    for value in values:
        a.observe(value)
    metrics.observe_many(b, values)
    assert _samples("itl", one_by_one) == pytest.approx(_samples("itl", bulk))
    assert _samples("itl", bulk)[("itl_count", ())] == len(values)


def test_observe_many_falls_back_when_the_library_internals_move():
    seen = []
    metrics.observe_many(SimpleNamespace(observe=seen.append), [0.1, 0.2])
    assert seen == [0.1, 0.2]


def test_tokens_per_second_is_a_sliding_window(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr("aieng.observability.observer.time.monotonic", lambda: clock["now"])
    observer = MetricsObserver(window_s=5.0, resource_every_s=1e9)
    step = StepResult(decode_s=0.01, decoded_rows=8)
    for _ in range(11):  # 8 tokens every second for 10 s
        observer.on_step(step, running=8, waiting=0, now=clock["now"])
        clock["now"] += 1.0
    clock["now"] -= 1.0
    # the window keeps the steps of the last 5 s: 6 steps x 8 tokens over a 5 s span
    assert metrics.TOKENS_PER_SECOND._value.get() == pytest.approx(6 * 8 / 5.0)
    clock["now"] += 100.0  # a long pause: everything older than 5 s leaves the window
    observer.on_step(StepResult(), running=0, waiting=0, now=clock["now"])
    assert metrics.TOKENS_PER_SECOND._value.get() == 0
