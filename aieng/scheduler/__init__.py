"""Continuous batching: which waiting requests join the running batch at each step, and the
engine thread that runs the steps.

- ``policy``: the waiting queue and the pure decision of who joins (priorities with aging,
  length buckets, the prefill token budget) — unit-tested without a model;
- ``loop``: the engine thread: cancellations and deadlines, ``engine.step(joiners)``, events
  handed back to whoever submitted.
"""

from aieng.scheduler.loop import EngineLoop, OverloadedError, RequestTimeoutError
from aieng.scheduler.policy import PRIORITIES, QueuedRequest, SchedulerConfig, WaitingQueue

__all__ = ["EngineLoop", "OverloadedError", "PRIORITIES", "QueuedRequest", "RequestTimeoutError", "SchedulerConfig",
           "WaitingQueue"]
