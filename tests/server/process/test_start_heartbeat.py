"""The heartbeat a starting worker gives gunicorn: steady while the start runs, over once it is
done, and withdrawn, said, past the start's limit so a hung start is still killed."""

import asyncio

from aieng.server.process.start_heartbeat import beat_interval, beat_while_starting


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def run(started_after_s: float, limit_s: float):
    clock, beats, limits = Clock(), [], []
    outcome = asyncio.run(
        beat_while_starting(
            lambda: beats.append(clock.now),
            lambda: clock.now >= started_after_s,
            interval_s=5.0,
            limit_s=limit_s,
            on_limit=lambda: limits.append(clock.now),
            clock=clock,
            sleep=clock.sleep,
        )
    )
    return outcome, beats, limits


def test_a_long_start_beats_every_interval_until_it_is_done():
    outcome, beats, limits = run(started_after_s=600, limit_s=1800)
    assert outcome == "started" and not limits
    assert beats == [5.0 * i for i in range(120)]  # from the first moment, never a gap of a timeout


def test_a_start_past_its_limit_stops_beating_and_says_so():
    outcome, beats, limits = run(started_after_s=10_000, limit_s=60)
    assert outcome == "limit" and limits == [60.0] and beats[-1] == 55.0


def test_a_started_worker_needs_no_beat_from_here():
    assert run(started_after_s=0, limit_s=60) == ("started", [], [])


def test_the_interval_leaves_room_inside_the_timeout():
    assert beat_interval(120) == 10.0 and beat_interval(2) == 0.5 and beat_interval(0.1) == 0.1
