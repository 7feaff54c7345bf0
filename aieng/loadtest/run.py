"""A whole load test: look at the server, run the load (one level or a sweep), check the server
again, plan capacity, write the results and the report. What ``aieng loadtest``, the ``load_test``
runbook and the notebook call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aieng.loadtest.checks import CheckLimits, ServerBooks, post_run_checks
from aieng.loadtest.client import RunConfig
from aieng.loadtest.replay import Replay, replay_level
from aieng.loadtest.report import capacity_text, level_name, results, write
from aieng.loadtest.summary import DEFAULT_SLOS, describe
from aieng.loadtest.sweep import capacity_plan, run_level, run_sweep, saturation
from aieng.loadtest.workload import Workload


@dataclass
class LoadTest:
    url: str
    workload: Workload
    out: Path
    sweep: bool = False
    slos: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SLOS))
    server_kind: str = "aieng"
    honour_retry_after: bool = False
    pid: int | None = None
    target_rps: float | None = None
    headroom: float = 0.2
    limits: CheckLimits = field(default_factory=CheckLimits)
    progress: bool = True
    replay: Replay | None = None  # send a capture's requests at their times (``workload`` is the replay's)


def run_loadtest(test: LoadTest, log: Callable[[str], None] = print) -> dict:
    """Run ``test``; returns results.json's content (``passed``: every check that ran passed)."""
    _reachable(test.url)
    books = ServerBooks(test.url, pid=test.pid)
    books.look("before")
    config = RunConfig(
        url=test.url, server_kind=test.server_kind, honour_retry_after=test.honour_retry_after, progress=test.progress
    )
    w = test.workload
    stop_sampling = books.sample_during()
    if test.sweep:
        log(f"[loadtest] sweeping {w.name} against {test.url}: {w.sweep.duration_s:g} s per level until saturation")
        levels = run_sweep(w, config, test.slos, on_warm=lambda: books.look("warm"), log=log)
        knee = saturation(levels)
        plan = capacity_plan(levels, test.target_rps, test.headroom)
        below = levels[: knee["level"]] if knee else levels  # the error-rate check judges the sustainable levels
    elif test.replay is not None:
        r = test.replay
        log(
            f"[loadtest] replaying {len(r.items)} captured requests ({', '.join(r.sources)}) against {test.url} "
            f"at {r.speed:g}x their timing: {r.span_s:.1f} s of arrivals"
        )
        levels = [replay_level(r, config, test.slos, on_warm=lambda: books.look("warm"))]
        knee, plan, below = None, None, levels
    else:
        a = w.arrival
        log(
            f"[loadtest] {w.name} against {test.url}: "
            + (
                f"{a.users} closed-loop users, think {a.think_s:g} s"
                if a.process == "closed"
                else f"{a.process} arrivals at {a.rate:g} req/s"
            )
            + f" for {w.duration_s:g} s"
        )
        levels = [run_level(w, config, test.slos, on_warm=lambda: books.look("warm"))]
        knee, plan, below = None, None, levels
    stop_sampling()
    records = [r for level in levels for r in level["records"]]
    measured = [r for level in below for r in level["records"] if r.measured]
    checks = post_run_checks(books, records, describe(measured, 1.0, test.slos), test.limits)
    data = results(
        w,
        test.url,
        test.server_kind,
        levels,
        sweep=test.sweep,
        saturation=knee,
        capacity=plan,
        checks=checks,
        slos=test.slos,
    )
    data["rss_samples"] = books.rss_samples
    if test.replay is not None:
        data["replay"] = test.replay.describe()
    paths = write(test.out, data, levels)
    for level in data["levels"]:
        a = level["summary"]["all"]
        log(
            f"[loadtest] {level_name(level)}: {a['requests']} measured requests, {a['throughput_rps']} req/s, goodput "
            f"{a['goodput_rps']} req/s ({a['slo_attainment']} met {test.slos}), TTFT p50/p99 "
            f"{a['ttft_s']['p50']}/{a['ttft_s']['p99']} s, ITL p99 {a['itl_s']['p99']} s, failed {a['failed']}"
        )
    if test.sweep:
        log(f"[loadtest] saturation: {data['saturation'] or 'not reached'}")
        log(f"[loadtest] capacity: {capacity_text(plan)}")
    for check in checks:
        log(
            f"[loadtest] check {check['name']}: {({True: 'passed', False: 'FAILED', None: 'skipped'})[check['passed']]}"
            f" - {check['detail']}"
        )
    log(f"[loadtest] wrote {paths['results']} and {paths['report']}")
    return data


def _reachable(url: str) -> None:
    try:
        httpx.get(url.rstrip("/") + "/v1/models", timeout=10)
    except httpx.HTTPError as exc:
        raise SystemExit(
            f"aieng loadtest: {url} does not answer ({exc}); start the server first (`make serve`, or `aieng serve`)"
        ) from None
