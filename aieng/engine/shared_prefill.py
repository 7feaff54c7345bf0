"""Rows that join together with the same long prompt opening prefill it once.

The prefix cache (``native/slots.py``) reuses what a row has *written*. A burst of chat requests
sharing one system prompt (a service's first minute, every user of a new conversation at once)
arrives before any of them has written it: each would prefill the same tokens beside the others,
sharing one step's prefill budget, so the burst's first tokens would all come late. Instead, a row
admitted while an earlier row is still prefilling an opening it shares (``MIN_REUSED_PREFIX``
tokens or more beyond what the row has) *follows* that leader: it plans no chunk while the leader
writes the shared part, then copies it from the leader's row (``Runner.extend_prefix``) and
prefills only its own rest. The leader's chunks get the whole budget, so the opening is in the
cache sooner than any row's would be in the shared race.
"""

from __future__ import annotations

from aieng.engine.native.slots import MIN_REUSED_PREFIX, common_prefix


def find_leader(engine, prompt: list[int], cached: int) -> tuple[str, int] | None:
    """(id, shared tokens) of the earlier prefilling row whose prompt shares the longest opening with
    ``prompt`` beyond ``cached`` and the leader's own progress, or None (always, without a prefix
    cache or with whole-prompt prefill). The last prompt token is never shared: it must run to give
    the row's first logits."""
    if not (engine.config.prefix_cache and engine.runner.chunked):
        return None
    best = None
    for row in engine.prefilling:
        shared = common_prefix(row.request.prompt_ids, prompt, len(prompt) - 1)
        ahead = shared >= max(cached, engine.prefilled[row.request_id]) + MIN_REUSED_PREFIX
        if ahead and (best is None or shared > best[1]):
            best = (row.request_id, shared)
    return best


def follow_leaders(engine) -> set[str]:
    """Between steps: each following row whose leader has written the shared part copies it and
    goes on alone; returns the rows still waiting (they plan no chunk this step). A leader that left
    (cancelled, failed) releases its followers to prefill on their own."""
    waiting = set()
    for rid, (leader, shared) in list(engine.leaders.items()):
        if rid not in engine.prefilled:  # the follower itself left
            del engine.leaders[rid]
            continue
        if leader not in engine.rows:
            del engine.leaders[rid]
            continue
        written = engine.prefilled.get(leader, len(engine.rows[leader].request.prompt_ids))
        if written < shared:
            waiting.add(rid)
            continue
        del engine.leaders[rid]
        done = engine.prefilled[rid]
        if shared > done:
            engine.runner.extend_prefix(rid, leader, shared)
            engine.prefilled[rid] = shared
            engine.rows[rid].cached_tokens += shared - done
    return waiting
