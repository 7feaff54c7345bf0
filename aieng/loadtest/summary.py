"""From request records to what a load test reports: percentiles per class, errors, goodput.

Goodput (DistServe's term, as vLLM's ``bench serve --goodput`` uses it): requests per second that
succeeded *and* met every SLO given. Throughput alone rewards a server that answers many requests
too late to be useful. Per request, the SLO quantities are:

- ``ttft``: time from the scheduled start to the first token;
- ``itl``: the request's 95th-percentile gap between tokens (stutter a reader would notice);
- ``tpot``: mean time per output token after the first;
- ``e2e``: time from the scheduled start to the last byte.

Only requests started inside the measurement window count (warm-up and cool-down excluded).
"""

from __future__ import annotations

import math
from collections import Counter

from aieng.loadtest.client import RequestRecord

SLO_NAMES = ("ttft", "itl", "tpot", "e2e")
DEFAULT_SLOS = {"ttft": 1.0, "itl": 0.1}  # seconds: a reply starts within a second and streams without stalls
QUANTILES = (50, 90, 99)


def parse_slos(items: list[str] | None) -> dict[str, float]:
    """``["ttft=0.5", "itl=0.05"]`` -> ``{"ttft": 0.5, "itl": 0.05}``; None or empty: the defaults."""
    if not items:
        return dict(DEFAULT_SLOS)
    slos = {}
    for item in items:
        name, _, value = item.partition("=")
        name = name.strip().lower()
        if name not in SLO_NAMES:
            raise ValueError(f"--slo {item!r}: the name must be one of {SLO_NAMES}")
        try:
            slos[name] = float(value.rstrip("s"))
        except ValueError:
            raise ValueError(f"--slo {item!r}: give seconds, e.g. ttft=0.5") from None
        if slos[name] <= 0:
            raise ValueError(f"--slo {item!r}: the limit must be > 0 seconds")
    return slos


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def request_itl(record: RequestRecord) -> float | None:
    return percentile(record.gaps, 95)


def meets(record: RequestRecord, slos: dict[str, float]) -> bool:
    if not record.ok:
        return False
    values = {"ttft": record.ttft_s, "itl": request_itl(record), "tpot": record.tpot_s, "e2e": record.e2e_s}
    return all(values[name] is None or values[name] <= limit for name, limit in slos.items())


def _spread(values: list[float]) -> dict:
    out = {f"p{q}": _round(percentile(values, q)) for q in QUANTILES}
    out["mean"] = _round(sum(values) / len(values)) if values else None
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)


def describe(records: list[RequestRecord], window_s: float, slos: dict[str, float],
             window_start: float | None = None) -> dict:
    """One group of measured requests (a class, or all): counts, rates, percentiles, goodput.

    Offered rate is per ``window_s`` (the requests were scheduled in it); throughput and goodput
    are per the time it took to *finish* them, from ``window_start`` to the last one's end when
    that is longer: a server past saturation finishes the window's requests late, and counting
    them over the window alone would credit it with the rate it was offered."""
    ok = [r for r in records if r.ok]
    met = [r for r in ok if meets(r, slos)]
    served_s = window_s
    if window_start is not None and records:
        served_s = max(window_s, max(r.end for r in records) - window_start)
    statuses = Counter(str(r.status) for r in records if not r.ok)
    return {
        "requests": len(records), "ok": len(ok), "failed": len(records) - len(ok),
        "errors_by_status": dict(sorted(statuses.items())),
        "rate_limited": sum(r.status == 429 for r in records), "retried_after_429": sum(r.retries for r in records),
        "offered_rps": round(len(records) / window_s, 4), "throughput_rps": round(len(ok) / served_s, 4),
        "goodput_rps": round(len(met) / served_s, 4), "served_s": round(served_s, 3), "slo_attainment": round(len(met) / len(records), 4) if records else None,
        "output_tokens_per_s": round(sum(r.completion_tokens for r in ok) / served_s, 2),
        "tokens_in": sum(r.prompt_tokens or 0 for r in ok), "tokens_out": sum(r.completion_tokens for r in ok),
        "ttft_s": _spread([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_s": _spread([g for r in ok for g in r.gaps]),
        "tpot_s": _spread([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_s": _spread([r.e2e_s for r in ok]),
        "client_lag_s": _spread([r.sent - r.scheduled for r in records]),
    }


def summarize(records: list[RequestRecord], window: tuple[float, float], slos: dict[str, float]) -> dict:
    """The run's measured requests (scheduled in ``window``, seconds from the start), overall and per class."""
    measured = [r for r in records if r.measured]
    classes = sorted({r.cls for r in records})
    start, seconds = window[0], window[1] - window[0]
    return {"window_s": round(seconds, 3), "slos": slos, "all": describe(measured, seconds, slos, start),
            "classes": {c: describe([r for r in measured if r.cls == c], seconds, slos, start) for c in classes}}


def timeline(records: list[RequestRecord], bin_s: float = 1.0) -> dict:
    """Tokens per second and requests in flight, per ``bin_s`` of the run (warm-up included)."""
    end = max((r.end for r in records), default=0.0)
    bins = int(end / bin_s) + 1
    tokens, in_flight = [0.0] * bins, [0] * bins
    for r in records:
        if r.first_token is not None:
            t = r.first_token
            tokens[int(t / bin_s)] += 1
            for gap in r.gaps:
                t += gap
                tokens[min(bins - 1, int(t / bin_s))] += 1
        for b in range(int(r.scheduled / bin_s), min(bins, int(r.end / bin_s) + 1)):
            in_flight[b] += 1
    return {"t_s": [round(i * bin_s, 3) for i in range(bins)], "tokens_per_s": [n / bin_s for n in tokens],
            "in_flight": in_flight}
