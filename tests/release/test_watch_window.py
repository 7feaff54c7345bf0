"""The watchdog's window judges the version it watches: request metrics carry ``version``."""

from aieng.observability.scrape import parse
from aieng.release.watch import window_between


def exposition(v1_ok: int, v2_ok: int, v1_failed: int, v1_early: int, v2_early: int) -> str:
    """/metrics text for two versions' generation counters."""
    route = 'route="/v1/completions"'
    return (
        f'aieng_requests_total{{{route},code="200",version="1"}} {v1_ok}\n'
        f'aieng_requests_total{{{route},code="200",version="2"}} {v2_ok}\n'
        f'aieng_requests_total{{{route},code="500",version="1"}} {v1_failed}\n'
        f'aieng_requests_finished_total{{finish_reason="length",version="1"}} {v1_ok}\n'
        f'aieng_requests_finished_total{{finish_reason="length",version="2"}} {v2_ok}\n'
        f'aieng_eos_early_total{{version="1"}} {v1_early}\n'
        f'aieng_eos_early_total{{version="2"}} {v2_early}\n'
    )


BEFORE = exposition(v1_ok=10, v2_ok=0, v1_failed=0, v1_early=0, v2_early=0)
AFTER = exposition(v1_ok=14, v2_ok=30, v1_failed=6, v1_early=3, v2_early=1)


def test_the_window_counts_only_the_watched_version_or_every_version_unfiltered():
    before, after = parse(BEFORE), parse(AFTER)
    v2 = window_between(before, after, 10.0, [], version="2")
    assert (v2.requests, v2.errors, v2.early_eos) == (30, 0, 1)  # v1's failures while it drained are not v2's
    v1 = window_between(before, after, 10.0, [], version="1")
    assert (v1.requests, v1.errors, v1.early_eos) == (10, 6, 3)
    both = window_between(before, after, 10.0, [])
    assert (both.requests, both.errors, both.early_eos) == (40, 6, 4)
