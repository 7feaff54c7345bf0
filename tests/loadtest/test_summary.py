"""Percentiles, goodput and saturation from request records built by hand."""

import pytest

from aieng.loadtest.client import RequestRecord
from aieng.loadtest.summary import meets, parse_slos, percentile, summarize, timeline
from aieng.loadtest.sweep import capacity_plan, saturation


def record(cls="a", scheduled=1.0, ttft=0.1, gaps=(0.02, 0.02, 0.02), status=200, measured=True, sent=None):
    first = scheduled + ttft
    end = first + sum(gaps)
    return RequestRecord(
        cls,
        scheduled,
        sent=scheduled if sent is None else sent,
        first_token=first,
        end=end,
        status=status,
        error=None if status == 200 else "boom",
        prompt_tokens=5,
        completion_tokens=len(gaps) + 1,
        gaps=list(gaps),
        measured=measured,
    )


def test_percentiles_interpolate_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5 and percentile([], 50) is None
    assert percentile(list(range(101)), 90) == 90


def test_goodput_counts_only_successful_requests_within_every_slo():
    records = [record(), record(ttft=2.0), record(gaps=(0.02, 0.5, 0.02)), record(status=500), record(measured=False)]
    slos = parse_slos(["ttft=1", "itl=0.1"])
    assert [meets(r, slos) for r in records[:4]] == [True, False, False, False]
    summary = summarize(records, (0.0, 4.0), slos)["all"]  # every request ended inside the window
    assert summary["requests"] == 4 and summary["ok"] == 3 and summary["failed"] == 1  # warm-up excluded...
    assert summary["throughput_rps"] == 1.0 and summary["goodput_rps"] == 0.5  # ...but its completion counts
    assert summary["slo_attainment"] == 0.25
    assert summary["errors_by_status"] == {"500": 1}
    late = summarize([record(scheduled=1.0, ttft=3.0)], (0.0, 2.0), slos)["all"]  # ends at 4.06 s, after the window
    assert late["offered_rps"] == 0.5 and late["throughput_rps"] == 0  # offered, not yet served
    assert summary["ttft_s"]["p50"] == pytest.approx(0.1) and summary["tokens_out"] == 12


def test_latency_is_measured_from_the_scheduled_start_not_the_send():
    late = record(scheduled=1.0, ttft=0.6, sent=1.5)  # the client sent it 0.5 s late; the user waited 0.6 s
    summary = summarize([late], (1.0, 2.0), {"ttft": 0.5})["all"]
    assert summary["ttft_s"]["p50"] == pytest.approx(0.6) and summary["goodput_rps"] == 0
    assert summary["client_lag_s"]["p50"] == pytest.approx(0.5)


def test_slo_flags_are_checked():
    assert parse_slos(None) == {"ttft": 1.0, "itl": 0.1}
    assert parse_slos(["e2e=2s"]) == {"e2e": 2.0}
    assert parse_slos(["ttft:0.5", " itl:0.05"]) == {"ttft": 0.5, "itl": 0.05}  # the runbook's spelling
    for bad in (["latency=1"], ["ttft=fast"], ["ttft=0"]):
        with pytest.raises(ValueError, match="--slo"):
            parse_slos(bad)


def test_the_timeline_puts_tokens_in_their_second():
    t = timeline([record(scheduled=0.5, ttft=0.2, gaps=(0.5, 1.0))])  # tokens at 0.7, 1.2 and 2.2 s
    assert t["tokens_per_s"] == [1, 1, 1] and t["in_flight"] == [1, 1, 1]


def level(offered, served, p50, attainment=1.0):
    return {
        "summary": {
            "all": {
                "offered_rps": offered,
                "throughput_rps": served,
                "goodput_rps": served * attainment,
                "slo_attainment": attainment,
                "e2e_s": {"p50": p50},
            }
        }
    }


def test_saturation_is_where_throughput_stops_following_the_rate():
    assert saturation([level(2, 2, 0.1), level(4, 4, 0.1)]) is None
    knee = saturation([level(2, 2, 0.1), level(4, 3.9, 0.12), level(8, 5.0, 0.9)])
    assert knee["level"] == 2 and knee["sustainable_rps"] == 3.9 and "fell behind" in knee["reason"]
    flat = saturation([level(2, 2, 0.1), level(2.2, 2.05, 0.5)])  # within 90% of offered, but flat and slow
    assert flat["level"] == 1 and "stopped rising" in flat["reason"]


def test_a_level_short_of_its_rate_is_not_the_knee_when_the_next_faster_level_keeps_up():
    """A stall at the end of one short level leaves it 10% behind; the level after shows it was noise."""
    noisy = [level(8, 7.0, 0.3), level(16, 16, 0.3), level(32, 31, 0.4), level(64, 33, 2.5), level(128, 32, 5.0)]
    knee = saturation(noisy)
    assert knee["level"] == 3 and knee["sustainable_rps"] == 31
    assert saturation([level(8, 7.0, 0.3)])["level"] == 0  # nothing after it yet: it stands (the sweep goes on)
    assert saturation([level(8, 7.0, 0.3), level(16, 9, 2.0)])["level"] == 0  # confirmed by the next level


def test_the_capacity_plan_takes_the_best_level_that_met_the_slos():
    levels = [level(2, 2, 0.1), level(4, 4, 0.2), level(8, 7.5, 0.5, attainment=0.6), level(16, 6, 3.0)]
    plan = capacity_plan(levels, target_rps=30, headroom=0.2)
    assert plan["per_replica_rps"] == 4 and plan["replicas"] == 9  # ceil(30 * 1.2 / 4)
    assert capacity_plan([level(8, 7.5, 0.5, attainment=0.5)], target_rps=30)["replicas"] is None
