"""The watchdog's window judges the version it watches: request metrics carry ``version``."""

from aieng.observability.scrape import parse
from aieng.release.watch import window_between

BEFORE = """
aieng_requests_total{route="/v1/completions",code="200",version="1"} 10
aieng_requests_total{route="/v1/completions",code="200",version="2"} 0
aieng_requests_total{route="/v1/completions",code="500",version="1"} 0
aieng_requests_finished_total{finish_reason="length",version="1"} 10
aieng_requests_finished_total{finish_reason="length",version="2"} 0
aieng_eos_early_total{version="1"} 0
aieng_eos_early_total{version="2"} 0
"""
AFTER = """
aieng_requests_total{route="/v1/completions",code="200",version="1"} 14
aieng_requests_total{route="/v1/completions",code="200",version="2"} 30
aieng_requests_total{route="/v1/completions",code="500",version="1"} 6
aieng_requests_finished_total{finish_reason="length",version="1"} 14
aieng_requests_finished_total{finish_reason="length",version="2"} 30
aieng_eos_early_total{version="1"} 3
aieng_eos_early_total{version="2"} 1
"""


def test_the_window_counts_only_the_watched_version_or_every_version_unfiltered():
    before, after = parse(BEFORE), parse(AFTER)
    v2 = window_between(before, after, 10.0, [], version="2")
    assert (v2.requests, v2.errors, v2.early_eos) == (30, 0, 1)  # v1's failures while it drained are not v2's
    v1 = window_between(before, after, 10.0, [], version="1")
    assert (v1.requests, v1.errors, v1.early_eos) == (10, 6, 3)
    both = window_between(before, after, 10.0, [])
    assert (both.requests, both.errors, both.early_eos) == (40, 6, 4)
