"""Where a canary check reads its numbers: the server's own ``/metrics``, or a Prometheus server.

Both give the same thing, a ``decision.Window`` per version over the check's interval, built from
the same series (the request metrics carry ``version``). The server source scrapes ``/metrics``
at the start and the end of the interval and takes the difference itself; the Prometheus source
asks Prometheus the PromQL below at the end of the interval. Both print that PromQL, so an
operator can paste the exact question the analysis asked into Prometheus or a Grafana panel.

Why offer Prometheus at all when the server answers directly: in a fleet behind a load balancer
one server's ``/metrics`` is one replica, while Prometheus has every replica (add a selector such
as ``job="aieng"``); and it is the record the alerts and dashboards are built on. Its numbers lag
by up to one scrape interval and ``increase()`` extrapolates to the range's edges, so counts are
rounded and an interval should span several scrapes (Flagger's advice is the same).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from aieng.observability.scrape import scrape
from aieng.release.decision import Window
from aieng.release.watch import GENERATION_ROUTES, window_between


def promql(version: str, seconds: float, selector: str = "") -> dict[str, str]:
    """The queries that make one version's window over the last ``seconds``."""
    labels = f'version="{version}"' + (f",{selector}" if selector else "")
    routes = f'route=~"{"|".join(GENERATION_ROUTES)}"'
    span = f"[{max(1, math.ceil(seconds))}s]"

    def p99(histogram: str) -> str:
        return f"histogram_quantile(0.99, sum by (le) (increase({histogram}_bucket{{{labels}}}{span})))"

    return {
        "requests": f"sum(increase(aieng_requests_total{{{routes},{labels}}}{span}))",
        "errors": f'sum(increase(aieng_requests_total{{{routes},code=~"5..",{labels}}}{span}))',
        "early_eos": f"sum(increase(aieng_eos_early_total{{{labels}}}{span}))",
        "tokens": f"sum(increase(aieng_generation_tokens_total{{{labels}}}{span}))",
        "latency_p99_s": p99("aieng_request_duration_seconds"),
        "ttft_p99_s": p99("aieng_time_to_first_token_seconds"),
    }


@dataclass
class ServerMetrics:
    """The server's merged ``/metrics`` (every worker), differenced over the interval."""

    url: str
    selector = ""  # the PromQL it prints matches every series, like the scrape

    def describe(self) -> str:
        return f"the server's /metrics at {self.url}"

    def measure(self, versions: list[str], interval_s: float, sleep: Callable[[float], None]) -> dict[str, Window]:
        before, start = scrape(self.url), time.monotonic()
        sleep(interval_s)
        after, seconds = scrape(self.url), time.monotonic() - start
        return {v: window_between(before, after, seconds, [], version=v) for v in versions}


@dataclass
class PrometheusMetrics:
    """A Prometheus server's instant queries at the end of the interval, over the interval."""

    url: str
    selector: str = ""  # extra label matchers for every series, e.g. 'job="aieng"'
    timeout_s: float = 10.0

    def describe(self) -> str:
        return f"Prometheus at {self.url}" + (f" ({{{self.selector}}})" if self.selector else "")

    def measure(self, versions: list[str], interval_s: float, sleep: Callable[[float], None]) -> dict[str, Window]:
        sleep(interval_s)
        at = time.time()
        return {v: self.window(v, interval_s, at) for v in versions}

    def window(self, version: str, seconds: float, at: float | None = None) -> Window:
        """``version``'s requests in the ``seconds`` before ``at`` (default: now), as Prometheus has them."""
        values = {key: self.query(q, at) for key, q in promql(version, seconds, self.selector).items()}
        requests = round(values["requests"] or 0.0)
        return Window(
            seconds=seconds,
            requests=requests,
            errors=round(values["errors"] or 0.0),
            early_eos=round(values["early_eos"] or 0.0),
            latency_p99_s=values["latency_p99_s"] if requests else None,
            ttft_p99_s=values["ttft_p99_s"] if requests else None,
            tokens_per_s=(values["tokens"] or 0.0) / seconds if seconds > 0 else None,
        )

    def query(self, expression: str, at: float | None = None) -> float | None:
        """One instant query's scalar: ``None`` when the result is empty or NaN (nothing observed)."""
        params = {"query": expression} | ({"time": f"{at:.3f}"} if at is not None else {})
        try:
            reply = httpx.get(self.url.rstrip("/") + "/api/v1/query", params=params, timeout=self.timeout_s)
            body = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise RuntimeError(f"Prometheus at {self.url} did not answer {expression!r}: {exc}") from exc
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus refused {expression!r}: {body.get('error', reply.text[:200])}")
        result = body["data"]["result"]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value
