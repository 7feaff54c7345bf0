"""A hot swap's engines share one KV cache: the old one keeps the slots its rows need, the
successor works in the slots below and grows over all of them when the old one is done; rows on
both sides decode exactly as alone."""

import pytest
import torch

from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams
from aieng.engine.native.slots import SlotKVCache, SlotShape
from aieng.engine.native.succession import awaits_kv_cache, hand_over_cache, reclaim_cache, take_cache

PROMPTS = [
    "reverse: apple stone river",
    "add: 27+58",
    "json: name=ana age=31 city=oslo",
    "sort: river apple stone",
    "reverse: moon sun",
    "add: 3+4",
]


@torch.inference_mode()
def test_keeping_only_the_rows_moves_them_to_the_top_and_hands_the_slots_below_over():
    shape = SlotShape(layers=2, kv_heads=1, head_dim=2, dtype=torch.float32)
    cache = SlotKVCache(shape, slots=6, capacity=4, device=torch.device("cpu"))
    for rid, length in zip("abc", (3, 2, 1)):
        slot = cache.acquire(rid)
        for t in cache.keys + cache.values:
            t[slot, 0, :length] = ord(rid)
        cache.lengths[slot] = length
    cache.start_decoding("b")  # b decodes in slot 0; a and c are still prefilling
    whole = list(cache.keys)
    below, _ = cache.keep_only_rows(extra=1)  # and one slot for a queued request
    assert cache.slots == 4 and cache.decoding == ["b"] and cache.owner == ["b", "a", "c", None]
    assert cache.slot_of == {"b": 0, "a": 1, "c": 2} and cache.lengths == [2, 3, 1, 0]
    for t in cache.keys + cache.values:
        for slot, rid, length in ((0, "b", 2), (1, "a", 3), (2, "c", 1)):
            assert bool((t[slot, 0, :length] == ord(rid)).all()), (slot, rid)
    assert cache.keys[0].data_ptr() == whole[0][2].data_ptr()  # a view of the same memory, top 4 slots
    successor = SlotKVCache.over(shape, below, [t[:2] for t in whole], capacity=4)
    assert successor.slots == 2 and successor.keys[0].data_ptr() == whole[0].data_ptr()
    assert successor.acquire("x") == 0
    successor.grow(whole, [t for t in whole])
    assert successor.slots == 6 and successor.slot_of == {"x": 0} and successor.owner[1:] == [None] * 5
    assert cache.acquire("q") == 3 and cache.free == 0  # the old cache never reaches below its top slots


def _drive(engines: dict, pending: dict, done: dict) -> None:
    """One step of every engine, each admitting its next pending request if it has room."""
    for name, engine in engines.items():
        joiners = [pending[name].pop(0)] if pending[name] and len(engine.rows) < engine.max_rows else []
        for event in engine.step(joiners).events:
            if event.finished:
                done[event.request_id] = tuple(event.token_ids)


def test_a_successor_works_in_its_predecessors_kv_memory_then_takes_all_of_it(demo, render):
    model, tokenizer = demo
    config = EngineConfig(compile=False, max_rows=6, prefill_chunk_tokens=8)
    params = [SamplingParams(max_tokens=12 if i < 3 else 30, temperature=0, ignore_eos=True) for i in range(6)]
    ids = [tokenizer.encode(render(p)) for p in PROMPTS]
    want = [r.token_ids for r in Engine(model, tokenizer, config=config).generate(ids, params)]
    old = Engine(model, tokenizer, config=config)
    allocation = [t.data_ptr() for t in old.runner.cache.keys]
    requests = [GenerationRequest(f"p{i}", list(p), sp) for i, (p, sp) in enumerate(zip(ids, params))]
    done: dict = {}
    pending = {"old": requests[:2], "new": []}
    for _ in range(3):  # p0 and p1 in flight on the old engine
        _drive({"old": old}, pending, done)
    assert len(old.rows) == 2 and not done

    new = Engine(model, tokenizer, config=config, replacing=old, kv_from_replaced=True)
    assert awaits_kv_cache(new) and new.max_rows == 0 and new.runner.cache.nbytes == 0  # no cache of its own
    new.warmup()  # on a small scratch cache
    assert new.max_rows == 0
    pending["old"].append(requests[2])  # queued on the old engine at the switch
    handover = hand_over_cache(old, queued=1)
    take_cache(new, handover)
    assert old.max_rows == 3 and new.max_rows == 3 and handover.given == 3
    assert new.runner.cache.keys[0].data_ptr() == allocation[0]  # the bottom of the old engine's memory
    assert new.prefix_counts() == {"hit": 0, "miss": 0, "evicted": 0, "kept": 0}  # on, and keeping nothing old
    pending["new"] = requests[3:]
    while old.rows or pending["old"]:  # both engines step, side by side, until the old one has finished
        _drive({"old": old, "new": new}, pending, done)
    assert {"p0", "p1", "p2"} <= set(done) and len(new.rows) == 3
    slots = dict(new.runner.cache.slot_of)
    reclaim_cache(new, handover)
    assert new.max_rows == 6 and [t.data_ptr() for t in new.runner.cache.keys] == allocation
    assert new.runner.cache.slot_of == slots  # rows in flight keep their slots: nothing moved
    assert new.prefix_counts() is not None  # still on over the whole allocation
    while len(done) < len(requests):
        _drive({"new": new}, pending, done)
    assert [done[f"p{i}"] for i in range(len(requests))] == want


def test_without_asking_for_it_a_successor_keeps_a_cache_of_its_own(demo):
    model, tokenizer = demo
    old = Engine(model, tokenizer, config=EngineConfig(compile=False, max_rows=4))
    new = Engine(model, tokenizer, config=EngineConfig(compile=False, max_rows=4), replacing=old)
    assert not awaits_kv_cache(new) and new.max_rows == 4
    assert new.runner.cache.keys[0].data_ptr() != old.runner.cache.keys[0].data_ptr()
    with pytest.raises(AssertionError):  # growing over memory it does not start is a bug, caught
        new.runner.cache.grow(old.runner.cache.keys, old.runner.cache.values)
