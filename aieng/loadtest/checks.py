"""After the load: is the server still healthy, and do its own books agree with the client's?

The first source article ends its load test with checks, not just numbers: memory did not grow,
nothing is stuck, errors stayed under the limit. Adapted here:

- ``rss_growth``: resident memory after the run against after the warm-up, at most 2% per 1,000
  requests and 5% in any run (the server's ``aieng_process_resident_memory_bytes``, or the process
  tree of ``--pid``);
- ``metrics_agree``: the server's ``/metrics`` deltas count the same generation requests, tokens
  and 5xx errors as the client did (an aieng server only);
- ``idle_after``: no request left running or waiting once the client is done;
- ``error_rate``: failed requests of the measured ones, under the limit.

A check that cannot be made (a server without aieng's metrics) is reported as skipped, with why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx

from aieng.observability.scrape import Snapshot, delta, scrape
from aieng.release.watch import generation_requests


@dataclass(frozen=True)
class CheckLimits:
    max_rss_growth_per_1k: float = 0.02  # of the warm RSS, per 1,000 requests...
    rss_growth_floor: float = 0.05  # ...but any run may grow this much: allocator arenas, caches and
    # graphs compiled in the background fill in over the first requests, which is not a leak
    max_error_rate: float = 0.01
    token_tolerance: float = 0.01  # client and server token counts may differ by this share
    idle_timeout_s: float = 15.0


@dataclass
class ServerBooks:
    """Looks at the server before, after the warm-up and after the run."""

    url: str
    pid: int | None = None
    snapshots: dict[str, Snapshot | None] = field(default_factory=dict)
    rss: dict[str, float | None] = field(default_factory=dict)
    rss_samples: list[tuple[float, float]] = field(default_factory=list)  # (s since sampling began, bytes)

    def sample_during(self, interval_s: float = 2.0):
        """Sample resident memory every ``interval_s`` on a thread until the returned stop() is called:
        a soak's memory is judged by its curve, not by two points."""
        import threading

        stop, start = threading.Event(), time.monotonic()

        def sample() -> None:
            while not stop.wait(interval_s):
                try:
                    value = self._rss(scrape(self.url) if self.pid is None else None)
                except (httpx.HTTPError, ValueError):
                    value = None
                if value:
                    self.rss_samples.append((round(time.monotonic() - start, 2), value))

        thread = threading.Thread(target=sample, name="loadtest-rss", daemon=True)
        thread.start()
        return lambda: (stop.set(), thread.join(interval_s + 10))

    def look(self, moment: str) -> None:
        try:
            snapshot = scrape(self.url)
        except (httpx.HTTPError, ValueError):
            snapshot = None
        if snapshot is not None and "aieng_requests_total" not in snapshot.names():
            snapshot = None  # not an aieng server: its metrics, if any, are not ours to read
        self.snapshots[moment] = snapshot
        self.rss[moment] = self._rss(snapshot)

    def _rss(self, snapshot: Snapshot | None) -> float | None:
        if self.pid is not None:
            import psutil

            try:
                root = psutil.Process(self.pid)
                return float(sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
            except psutil.Error:
                return None
        value = snapshot.value("aieng_process_resident_memory_bytes") if snapshot else 0.0
        return value or None

    def wait_idle(self, timeout_s: float) -> tuple[Snapshot | None, float]:
        """The last look, and how long after the client finished it was taken."""
        start = time.monotonic()
        while True:
            self.look("after")
            after, waited = self.snapshots["after"], time.monotonic() - start
            if (
                after is None
                or waited > timeout_s
                or not (after.value("aieng_requests_running") or after.value("aieng_requests_waiting"))
            ):
                return after, waited
            time.sleep(0.5)


def post_run_checks(
    books: ServerBooks, records: list, measured_summary: dict, limits: CheckLimits = CheckLimits()
) -> list[dict]:
    """Each check: ``{name, passed (True/False/None: skipped), detail}``."""
    after, waited = books.wait_idle(limits.idle_timeout_s)
    checks = [_rss_growth(books, len(records), limits), _metrics_agree(books, records, limits)]
    if after is None:
        checks.append(_skipped("idle_after", "the server has no aieng metrics to show running and waiting requests"))
    else:
        running, waiting = after.value("aieng_requests_running"), after.value("aieng_requests_waiting")
        checks.append(
            {
                "name": "idle_after",
                "passed": running == 0 and waiting == 0,
                "detail": f"{running:g} running, {waiting:g} waiting {waited:.1f} s after the client finished "
                f"(waits up to {limits.idle_timeout_s:g} s)",
            }
        )
    total, failed = measured_summary["requests"], measured_summary["failed"]
    rate = failed / total if total else 0.0
    checks.append(
        {
            "name": "error_rate",
            "passed": bool(total) and rate <= limits.max_error_rate,
            "detail": f"{failed} of {total} measured requests failed ({rate:.2%}; limit "
            f"{limits.max_error_rate:.2%})" + ("" if total else ": nothing was measured"),
        }
    )
    return checks


def _skipped(name: str, why: str) -> dict:
    return {"name": name, "passed": None, "detail": why}


def _rss_growth(books: ServerBooks, requests: int, limits: CheckLimits) -> dict:
    warm, after = books.rss.get("warm") or books.rss.get("before"), books.rss.get("after")
    if not warm or not after:
        return _skipped("rss_growth", "no resident-memory reading (give --pid for a server without aieng metrics)")
    growth = (after - warm) / warm
    allowed = max(limits.rss_growth_floor, limits.max_rss_growth_per_1k * requests / 1000)
    peak = max((v for _, v in books.rss_samples), default=None)
    return {
        "name": "rss_growth",
        "passed": growth <= allowed,
        "value": round(growth, 5),
        "detail": f"{warm / 2**20:.0f} MiB after warm-up -> {after / 2**20:.0f} MiB after {requests} requests"
        + (f" (peak {peak / 2**20:.0f} MiB over {len(books.rss_samples)} samples)" if peak else "")
        + ": "
        f"{growth:+.2%} (allowed {allowed:.1%}: {limits.max_rss_growth_per_1k:.0%} per 1,000 requests, "
        f"at least {limits.rss_growth_floor:.0%})",
    }


def _metrics_agree(books: ServerBooks, records: list, limits: CheckLimits) -> dict:
    before, after = books.snapshots.get("before"), books.snapshots.get("after")
    if before is None or after is None:
        return _skipped("metrics_agree", "the server has no aieng /metrics")
    d = delta(before, after)
    served, errors = generation_requests(d)
    tokens = d.value("aieng_generation_tokens_total")
    answered = [r for r in records if r.status != 0]  # a request that got no response may never have arrived
    client_tokens = sum(r.completion_tokens for r in records if r.ok)  # the server counts finished replies only
    client_errors = sum(500 <= r.status < 600 for r in records)
    problems = []
    if not len(answered) <= served <= len(records):
        problems.append(
            f"server counted {served:g} generation requests, client {len(answered)} answered of {len(records)} sent"
        )
    # a request the client hung up on may still have finished on the server (and been counted) first
    unknown = sum(r.max_tokens for r in records if r.cancelled or (r.status == 200 and r.error is not None))
    slack = limits.token_tolerance * max(client_tokens, 1)
    if not client_tokens - slack <= tokens <= client_tokens + unknown + slack:
        problems.append(
            f"server generated {tokens:g} tokens, client received {client_tokens}"
            + (f" (+ up to {unknown} in replies it hung up on or that failed mid-stream)" if unknown else "")
        )
    if errors != client_errors:
        problems.append(f"server answered {errors:g} requests with 5xx, client saw {client_errors}")
    return {
        "name": "metrics_agree",
        "passed": not problems,
        "detail": "; ".join(problems)
        or f"requests {served:g}, tokens {tokens:g}, 5xx {errors:g}: as counted by the client",
    }
