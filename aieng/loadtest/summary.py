"""From request records to what a load test reports: percentiles per class, errors, goodput.

Goodput (DistServe's term, as vLLM's ``bench serve --goodput`` uses it): requests per second that
succeeded *and* met every SLO given. Throughput alone rewards a server that answers many requests
too late to be useful. Per request, the SLO quantities are:

- ``ttft``: time from the scheduled start to the first token;
- ``itl``: the request's 95th-percentile gap between streamed chunks (stutter a reader would
  notice; a chunk can carry several tokens, and a token with no text of its own sends none, so
  this is a gap between pieces of text, as vLLM's benchmark measures it; ``tpot`` is per token);
- ``tpot``: mean time per output token after the first;
- ``e2e``: time from the scheduled start to the last byte.

Percentiles and errors are of the requests scheduled inside the measurement window (warm-up and
cool-down excluded); throughput and goodput count the requests that finished inside it.
"""

from __future__ import annotations

import math
from collections import Counter

from aieng.loadtest.client import RequestRecord

SLO_NAMES = ("ttft", "itl", "tpot", "e2e")
DEFAULT_SLOS = {"ttft": 1.0, "itl": 0.1}  # seconds: a reply starts within a second and streams without stalls
QUANTILES = (50, 90, 99)


def parse_slos(items: list[str] | None) -> dict[str, float]:
    """``["ttft=0.5", "itl=0.05"]`` -> ``{"ttft": 0.5, "itl": 0.05}``; None or empty: the defaults.
    ``ttft:0.5`` is read the same: a papermill parameter line may hold only one ``=``."""
    if not items:
        return dict(DEFAULT_SLOS)
    slos = {}
    for item in items:
        name, _, value = item.replace(":", "=", 1).partition("=")
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


def describe(
    records: list[RequestRecord], window_s: float, slos: dict[str, float], finished: list[RequestRecord] | None = None
) -> dict:
    """One group of measured requests (a class, or all): counts, percentiles, and rates.

    ``failed`` counts requests that did not end as their class meant (a soak's cancels, expired
    deadlines and 400s are not failures); ``outcomes`` counts each ending.

    ``records`` were scheduled in the window (their percentiles, errors and offered rate);
    ``finished`` are the requests that *ended* in it, whenever they were scheduled: throughput,
    goodput and tokens/s count those. At steady state the two rates agree; past saturation the
    server finishes fewer than arrive, and only completions show it (default: ``records``)."""
    ok = [r for r in records if r.ok]
    done = [r for r in (records if finished is None else finished) if r.ok]
    met = [r for r in done if meets(r, slos)]
    statuses = Counter(str(r.status) for r in records if not r.ok and not r.cancelled)
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": sum(not r.expected for r in records),
        "outcomes": dict(sorted(Counter(r.outcome for r in records).items())),
        "errors_by_status": dict(sorted(statuses.items())),
        "rate_limited": sum(r.status == 429 for r in records),
        "retried_after_429": sum(r.retries for r in records),
        "offered_rps": round(len(records) / window_s, 4),
        "throughput_rps": round(len(done) / window_s, 4),
        "goodput_rps": round(len(met) / window_s, 4),
        "slo_attainment": round(sum(meets(r, slos) for r in ok) / len(records), 4) if records else None,
        "output_tokens_per_s": round(sum(r.completion_tokens for r in done) / window_s, 2),
        "tokens_in": sum(r.prompt_tokens or 0 for r in ok),
        "tokens_out": sum(r.completion_tokens for r in ok),
        "ttft_s": _spread([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_s": _spread([g for r in ok for g in r.gaps]),
        "tpot_s": _spread([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_s": _spread([r.e2e_s for r in ok]),
        "client_lag_s": _spread([r.sent - r.scheduled for r in records]),
    }


def summarize(records: list[RequestRecord], window: tuple[float, float], slos: dict[str, float]) -> dict:
    """The run's measured requests (scheduled in ``window``, seconds from the start), overall and per class."""
    measured = [r for r in records if r.measured]
    finished = [r for r in records if window[0] <= r.end < window[1]]
    classes = sorted({r.cls for r in records})
    seconds = window[1] - window[0]
    return {
        "window_s": round(seconds, 3),
        "slos": slos,
        "all": describe(measured, seconds, slos, finished),
        "classes": {
            c: describe([r for r in measured if r.cls == c], seconds, slos, [r for r in finished if r.cls == c])
            for c in classes
        },
    }


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
    return {
        "t_s": [round(i * bin_s, 3) for i in range(bins)],
        "tokens_per_s": [n / bin_s for n in tokens],
        "in_flight": in_flight,
    }
