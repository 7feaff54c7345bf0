"""How much prefill compute goes to padding, with and without length buckets.

Feeds a set of prompt lengths through the real ``WaitingQueue`` and reports, over all the prefill
groups it forms, the share of padded positions. Notebook 05 plots it.
"""

from __future__ import annotations

from dataclasses import replace

from aieng.engine import GenerationRequest
from aieng.engine.params import SamplingParams
from aieng.scheduler.policy import QueuedRequest, SchedulerConfig, WaitingQueue


def padding_waste(
    prompt_lengths: list[int], config: SchedulerConfig, *, bucketed: bool = True, free_slots: int | None = None
) -> dict:
    if not bucketed:
        config = replace(config, bucket_edges=(max(prompt_lengths) + 1,))
    queue = WaitingQueue(replace(config, max_queue=len(prompt_lengths) + 1))
    for i, n in enumerate(prompt_lengths):
        queue.add(QueuedRequest(GenerationRequest(f"r{i}", [0] * n, SamplingParams()), arrival=0.0))
    groups, real, padded = [], 0, 0
    while len(queue):
        group = queue.pop_joiners(0.0, free_slots or config.max_batch_size)
        lengths = [q.prompt_tokens for q in group]
        groups.append(lengths)
        real += sum(lengths)
        padded += max(lengths) * len(lengths)
    return {
        "groups": len(groups),
        "real_tokens": real,
        "padded_tokens": padded,
        "waste": 1 - real / padded if padded else 0.0,
    }
