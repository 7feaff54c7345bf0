"""Read ``/metrics`` back: samples, sums over labels, and quantiles from histogram buckets.

The notebooks, the triage runbook and the tests read the server exactly as Prometheus would —
over HTTP, in the text format — and compute the same quantities a PromQL query would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Snapshot:
    samples: dict[tuple[str, tuple], float]  # (name, sorted label items) -> value

    def value(self, metric: str, /, **labels) -> float:
        """Sum of every sample of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return sum(v for (n, items), v in self.samples.items() if n == metric and want <= set(items))

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}

    def by_label(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for (n, items), v in self.samples.items():
            if n == name:
                key = dict(items).get(label)
                if key is not None:
                    out[key] = out.get(key, 0.0) + v
        return out

    def buckets(self, histogram: str, **labels) -> list[tuple[float, float]]:
        """Cumulative (upper bound, count) pairs of a histogram, summed over other labels."""
        want = set(labels.items())
        acc: dict[float, float] = {}
        for (n, items), v in self.samples.items():
            if n == f"{histogram}_bucket" and want <= set(items):
                le = float(dict(items)["le"])
                acc[le] = acc.get(le, 0.0) + v
        return sorted(acc.items())

    def quantile(self, histogram: str, q: float, **labels) -> float:
        return histogram_quantile(q, self.buckets(histogram, **labels))

    def mean(self, histogram: str, **labels) -> float:
        count = self.value(f"{histogram}_count", **labels)
        return self.value(f"{histogram}_sum", **labels) / count if count else float("nan")


def scrape(base_url: str, timeout: float = 10.0) -> Snapshot:
    text = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout).text
    return parse(text)


def parse(text: str) -> Snapshot:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Snapshot(samples)


def delta(before: Snapshot, after: Snapshot) -> Snapshot:
    """Counter and histogram increases between two scrapes (gauges: the later value)."""
    out = dict(after.samples)
    for key, value in after.samples.items():
        if key in before.samples and (key[0].endswith(("_total", "_count", "_sum", "_bucket"))):
            out[key] = value - before.samples[key]
    return Snapshot(out)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile: linear interpolation inside the bucket holding the rank."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    total = buckets[-1][1]
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return previous_bound
            span = count - previous_count
            return previous_bound + (bound - previous_bound) * ((rank - previous_count) / span if span else 0)
        previous_bound, previous_count = bound, count
    return previous_bound
