"""One load level, a sweep of rates up to saturation, and the capacity plan that follows.

Saturation is where offering more stops buying more: the server's throughput stays flat (or
falls behind the offered rate) while latency climbs, because requests now queue. The sweep raises
an open-loop rate level by level and stops one level after it sees that knee. The capacity plan
reads the sweep: the highest rate at which the server still met the SLOs for nearly every request
is what one replica can be given; a target rate with headroom then needs ``ceil`` of the ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from aieng.loadtest.client import RunConfig, run
from aieng.loadtest.summary import summarize, timeline
from aieng.loadtest.workload import Workload

MIN_ATTAINMENT = 0.95  # share of a level's requests that must meet every SLO for the level to count


def run_level(workload: Workload, config: RunConfig, slos: dict[str, float], on_warm=None) -> dict:
    """Run the workload once: its summary, timeline and every request."""
    records, wall = run(workload, config, on_warm=on_warm)
    window = (workload.warmup_s, workload.duration_s - workload.cooldown_s)
    arrival = workload.arrival
    return {
        "process": arrival.process,
        "rate": arrival.rate if arrival.process != "closed" else None,
        "users": arrival.users if arrival.process == "closed" else None,
        "wall_s": round(wall, 3),
        "summary": summarize(records, window, slos),
        "timeline": timeline(records),
        "records": records,
    }


def sweep_rates(workload: Workload) -> list[float]:
    s = workload.sweep
    return list(s.rates) if s.rates else [round(s.start * s.factor**i, 4) for i in range(s.max_levels)]


def run_sweep(
    workload: Workload, config: RunConfig, slos: dict[str, float], *, on_warm=None, log: Callable[[str], None] = print
) -> list[dict]:
    """Open-loop levels at rising rates (``sweep`` of the workload), until one level past saturation."""
    s = workload.sweep
    process = workload.arrival.process if workload.arrival.process != "closed" else "poisson"
    warmup = min(workload.warmup_s, s.duration_s / 4)
    cooldown = min(workload.cooldown_s, s.duration_s / 8)
    levels: list[dict] = []
    for i, rate in enumerate(sweep_rates(workload)):
        # a level past saturation must not outlast itself by the full request timeout: what has not
        # finished within twice the level's length counts as failed, and the sweep moves on
        level_workload = replace(
            workload.with_arrival(process=process, rate=rate),
            duration_s=s.duration_s,
            warmup_s=warmup,
            cooldown_s=cooldown,
            seed=workload.seed + i,
            timeout_s=min(workload.timeout_s, max(30.0, 2 * s.duration_s)),
        )
        level = run_level(level_workload, config, slos, on_warm=on_warm if i == 0 else None)
        levels.append(level)
        a = level["summary"]["all"]
        log(
            f"[loadtest] {process} {rate:.4g} req/s: throughput {a['throughput_rps']:g} req/s, goodput "
            f"{a['goodput_rps']:g}, e2e p50 {a['e2e_s']['p50']} s, failed {a['failed']}"
        )
        knee = saturation(levels)
        if knee is not None and (knee["level"] < len(levels) - 1 or a["throughput_rps"] < 0.5 * a["offered_rps"]):
            break  # one level past the knee shows it was not noise (or the server is already far past it)
    return levels


def _past_knee(levels: list[dict], i: int) -> tuple[bool, bool]:
    """(behind, flat) for level ``i``: throughput below 90% of the offered rate; throughput up by
    under 5% on the level before while median end-to-end latency rose by over 50%."""
    a = levels[i]["summary"]["all"]
    behind = a["throughput_rps"] < 0.9 * a["offered_rps"]
    flat = False
    if i:
        b = levels[i - 1]["summary"]["all"]
        p50, prev = a["e2e_s"]["p50"], b["e2e_s"]["p50"]
        flat = bool(a["throughput_rps"] < 1.05 * b["throughput_rps"] and p50 is not None and prev and p50 > 1.5 * prev)
    return behind, flat


def saturation(levels: list[dict]) -> dict | None:
    """The first level past the knee (``_past_knee``) that the next level confirms. A level is
    judged on a few seconds of completions: a stall near its end (a noisy neighbour, a GC pause)
    can leave its throughput 10% short at a rate far below capacity. If the next, faster level kept
    up with its offered rate, that was noise, not the knee. ``sustainable_rps`` is the throughput
    of the level before it."""
    marks = [_past_knee(levels, i) for i in range(len(levels))]  # (behind, flat) per level
    for i, level in enumerate(levels):
        a = level["summary"]["all"]
        if any(marks[i]) and (i + 1 == len(levels) or any(marks[i + 1])):
            previous = levels[i - 1]["summary"]["all"]["throughput_rps"] if i else None
            return {
                "level": i,
                "offered_rps": a["offered_rps"],
                "throughput_rps": a["throughput_rps"],
                "sustainable_rps": previous,
                "reason": "throughput fell behind the offered rate"
                if marks[i][0]
                else "throughput stopped rising while median latency climbed",
            }
    return None


def capacity_plan(
    levels: list[dict], target_rps: float | None = None, headroom: float = 0.2, min_attainment: float = MIN_ATTAINMENT
) -> dict:
    """The highest offered rate one server met the SLOs at, and the replicas a target rate needs."""
    good = [
        lv
        for lv in levels
        if (lv["summary"]["all"]["slo_attainment"] or 0) >= min_attainment
        and lv["summary"]["all"]["throughput_rps"] >= 0.9 * lv["summary"]["all"]["offered_rps"]
    ]
    per_replica = max((lv["summary"]["all"]["goodput_rps"] for lv in good), default=None)
    plan = {
        "per_replica_rps": per_replica,
        "min_attainment": min_attainment,
        "headroom": headroom,
        "target_rps": target_rps,
        "replicas": None,
    }
    if per_replica and target_rps:
        plan["replicas"] = max(1, math.ceil(target_rps * (1 + headroom) / per_replica))
    return plan
