"""Open-loop arrival schedules have the rate asked for, and bursty ones clump."""

import statistics

import pytest

from aieng.loadtest.arrivals import arrival_times


@pytest.mark.parametrize("process", ["constant", "poisson", "bursty"])
def test_every_process_keeps_the_mean_rate(process):
    times = arrival_times(process, 20.0, 200.0, burstiness=0.3)
    assert abs(len(times) / 200.0 - 20.0) < 1.5
    assert times == sorted(times) and times[-1] < 200.0


def test_bursty_gaps_vary_more_than_poisson_and_constant_not_at_all():
    def cv(process):
        times = arrival_times(process, 10.0, 500.0, burstiness=0.25)
        gaps = [b - a for a, b in zip(times, times[1:])]
        return statistics.pstdev(gaps) / statistics.mean(gaps)

    assert cv("constant") < 1e-6
    assert 0.9 < cv("poisson") < 1.1  # exponential gaps: coefficient of variation 1
    assert cv("bursty") > 1.6  # gamma shape 0.25: 1/sqrt(0.25) = 2


def test_the_schedule_is_seeded_and_bounded():
    assert arrival_times("poisson", 5, 10, seed=1) == arrival_times("poisson", 5, 10, seed=1)
    assert arrival_times("poisson", 5, 10, seed=1) != arrival_times("poisson", 5, 10, seed=2)
    assert len(arrival_times("constant", 100, 10, limit=7)) == 7
    with pytest.raises(ValueError, match="rate > 0"):
        arrival_times("poisson", 0, 10)
