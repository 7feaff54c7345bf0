"""Continuous batching: who joins the running batch at each step, and the thread that runs the steps.

- ``policy``: the waiting queue and the pure decision of who joins (priorities with aging,
  length buckets, the prefill token budget): unit-tested without a model;
- ``scheduler``: the owner of every request, waiting or running: ``schedule(now)`` before a
  step, ``update(step, now)`` after it;
- ``stats``: the timings of one request, for its log line;
- ``loop``: the engine thread: schedule, ``engine.step``, update, deliver;
- ``padding``: how much prefill goes to padding, with and without length buckets.
"""

from aieng.scheduler.loop import EngineLoop
from aieng.scheduler.policy import PRIORITIES, QueuedRequest, SchedulerConfig, WaitingQueue
from aieng.scheduler.scheduler import OverloadedError, RequestTimeoutError, Scheduler, SchedulerOutput
from aieng.scheduler.stats import RequestStats

__all__ = [
    "EngineLoop",
    "OverloadedError",
    "PRIORITIES",
    "QueuedRequest",
    "RequestStats",
    "RequestTimeoutError",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "WaitingQueue",
]
