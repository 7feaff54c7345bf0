"""Prefix caching in the slot cache: free slots keep what their rows held, a new row takes the
slot holding the longest prefix of its prompt (or copies it from a running row), the least
recently used free slot is evicted, a leaving decoding row keeps its tokens through the move that
keeps decoding rows packed, and a hot swap's successor never reuses the old version's slots."""

import random

import pytest
import torch

from aieng.engine.native.slots import MIN_REUSED_PREFIX, SlotKVCache, SlotShape, common_prefix

SHAPE = SlotShape(layers=2, kv_heads=1, head_dim=2, dtype=torch.float32)


def naive_common_prefix(a, b, limit):
    n = 0
    while n < min(len(a), len(b), limit) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_agrees_with_the_plain_loop():
    rng = random.Random(0)
    for _ in range(500):
        shared = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        a = shared + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
        b = shared + [rng.randrange(4) for _ in range(rng.randrange(0, 10))]
        limit = rng.randrange(-1, 60)
        assert common_prefix(a, b, limit) == naive_common_prefix(a, b, limit), (a, b, limit)


def fill(cache: SlotKVCache, request_id: str, tokens: list[int], start: int = 0, *, prompt: bool = True) -> int:
    """Write keys and values that encode each token (key = token id, value = -id), as a forward would."""
    slot = cache.slot_of[request_id]
    for t, sign in ((cache.keys, 1), (cache.values, -1)):
        for layer in t:
            for j, token in enumerate(tokens):
                layer[slot, 0, start + j] = sign * token
    cache.wrote(slot, tokens, prompt=prompt)
    return slot


def holds(cache: SlotKVCache, slot: int, tokens: list[int]) -> bool:
    want = torch.tensor(tokens, dtype=torch.float32)[:, None]
    return all(
        bool((layer[slot, 0, : len(tokens)] == sign * want).all())
        for t, sign in ((cache.keys, 1), (cache.values, -1))
        for layer in t
    )


def cache_with(slots=4, capacity=64, keep=True) -> SlotKVCache:
    return SlotKVCache(SHAPE, slots=slots, capacity=capacity, device=torch.device("cpu"), keep_prefixes=keep)


SYSTEM = list(range(100, 140))  # a 40-token shared system prompt


@torch.inference_mode()
def test_a_released_row_keeps_its_tokens_and_the_next_prompt_with_that_prefix_takes_them():
    cache = cache_with()
    slot = cache.acquire("a", SYSTEM + [1, 2])
    assert cache.lengths[slot] == 0 and cache.counts.miss == 0  # a miss is a prefilled token
    fill(cache, "a", SYSTEM + [1, 2])
    assert cache.counts.miss == 42
    cache.start_decoding("a")
    fill(cache, "a", [7], start=42, prompt=False)  # one generated token decoded
    cache.release("a")
    assert cache.kept_tokens == 43 and cache.tokens[0] == SYSTEM + [1, 2, 7]

    again = cache.acquire("b", SYSTEM + [3, 4, 5])  # the same system prompt, another question
    assert again != 0 and cache.lengths[again] == 40 and holds(cache, again, SYSTEM)  # copied...
    assert cache.tokens[0] == SYSTEM + [1, 2, 7] and holds(cache, 0, SYSTEM + [1, 2])  # ...a's turn kept too
    assert (cache.counts.hit, cache.counts.miss, cache.counts.evicted) == (40, 42, 0)
    cache.release("b")
    slot = cache.acquire("c", SYSTEM + [1, 2, 7, 8])  # a's next turn: a's slot, taken as it is
    assert slot == 0 and cache.lengths[0] == 43


@torch.inference_mode()
def test_a_prompt_sharing_only_a_template_opening_does_not_take_a_slot_keeping_a_long_prompt():
    cache = cache_with(slots=3)
    opening = [1, 2, 3]  # e.g. "<|im_start|>system\n"
    cache.acquire("a", opening + SYSTEM + [9])
    fill(cache, "a", opening + SYSTEM + [9])
    cache.release("a")
    kept = cache.slot_of.get("a", 0)
    other = cache.acquire("miss", opening + [500 + j for j in range(40)])
    assert other != kept and cache.lengths[other] == 0 and cache.tokens[kept] == opening + SYSTEM + [9]
    hit = cache.acquire("hit", opening + SYSTEM + [4])
    assert cache.lengths[hit] == 43


@torch.inference_mode()
def test_the_last_prompt_token_is_always_prefilled_even_when_all_of_it_is_cached():
    cache = cache_with()
    cache.acquire("a", SYSTEM)
    fill(cache, "a", SYSTEM)
    cache.release("a")
    slot = cache.acquire("b", SYSTEM)
    assert cache.lengths[slot] == len(SYSTEM) - 1  # its logits need one forward


@torch.inference_mode()
def test_a_prefix_of_a_running_row_is_copied_when_long_enough():
    cache = cache_with()
    cache.acquire("a", SYSTEM + [1])
    fill(cache, "a", SYSTEM + [1])
    cache.start_decoding("a")
    slot = cache.acquire("b", SYSTEM + [9, 9])
    assert slot != cache.slot_of["a"] and cache.lengths[slot] == 40 and holds(cache, slot, SYSTEM)
    short = list(range(MIN_REUSED_PREFIX - 1)) + [5, 6]
    cache.acquire("c", short[:-2] + [0])
    fill(cache, "c", short[:-2] + [0])
    assert cache.lengths[cache.acquire("d", short)] == 0  # a few shared tokens of a longer prompt: no copy


@torch.inference_mode()
def test_a_repeated_short_prompt_is_a_whole_hit_however_few_its_tokens():
    """Below ``MIN_REUSED_PREFIX`` a match counts when it is all of the prompt but its last token:
    from a free slot keeping it (taken as it is), and from a running row (copied); a slot keeping a
    long prompt that merely opens the same way gives a copy and keeps what it holds."""
    cache = cache_with(slots=4)
    short = [7, 8, 9, 10, 11]
    cache.acquire("a", short)
    fill(cache, "a", short)
    cache.start_decoding("a")
    fill(cache, "a", [3], start=len(short), prompt=False)
    copied = cache.acquire("b", short)  # a is still running: its prompt is copied
    assert copied != cache.slot_of["a"] and cache.lengths[copied] == len(short) - 1 and holds(cache, copied, short[:-1])
    fill(cache, "b", short[-1:], start=len(short) - 1)
    cache.release("a")
    cache.release("b")
    kept = {tuple(cache.tokens[slot]): slot for slot in range(cache.slots)}
    again = cache.acquire("c", short)
    assert again in (kept[(*short, 3)], kept[tuple(short)]) and cache.lengths[again] == len(short) - 1
    assert cache.counts.hit == 2 * (len(short) - 1)

    long = cache_with(slots=3)
    long.acquire("sys", [1, 2, 3] + SYSTEM)
    fill(long, "sys", [1, 2, 3] + SYSTEM)
    long.release("sys")
    slot = long.acquire("q", [1, 2, 3, 4])  # all but its last token open the long prompt
    assert slot != 0 and long.lengths[slot] == 3 and long.tokens[0] == [1, 2, 3] + SYSTEM


@torch.inference_mode()
def test_a_new_row_with_nothing_to_reuse_evicts_the_least_recently_used_free_slot():
    cache = cache_with(slots=3)
    prompts = {rid: [10 * k + j for j in range(20)] for k, rid in enumerate("abc", start=1)}
    for rid in "abc":
        cache.acquire(rid, prompts[rid])
        fill(cache, rid, prompts[rid])
    for rid in "bac":  # b leaves first: it is the oldest
        cache.release(rid)
    kept = {tuple(cache.tokens[s]): s for s in range(3)}
    oldest = kept[tuple(prompts["b"])]
    slot = cache.acquire("d", [999] * 5)
    assert slot == oldest and cache.lengths[slot] == 0 and cache.counts.evicted == 20
    assert cache.kept_tokens == 40  # a's and c's are still there
    assert cache.lengths[cache.acquire("e", prompts["a"] + [1])] == 20


@torch.inference_mode()
def test_a_leaving_decoding_row_keeps_its_tokens_through_the_exchange_that_packs_the_rows():
    cache = cache_with(slots=3)
    for rid, base in (("a", 10), ("b", 40)):
        tokens = list(range(base, base + 20))
        cache.acquire(rid, tokens)
        fill(cache, rid, tokens)
        cache.start_decoding(rid)
    cache.release("a")  # b moves down to slot 0; a's tokens move up to slot 1
    assert cache.decoding == ["b"] and cache.slot_of == {"b": 0}
    assert holds(cache, 0, list(range(40, 60))) and holds(cache, 1, list(range(10, 30)))
    assert cache.tokens[1] == list(range(10, 30)) and cache.owner[1] is None
    assert cache.lengths[cache.acquire("c", list(range(10, 28)) + [0])] == 18


@torch.inference_mode()
def test_off_nothing_is_kept_and_nothing_is_reused():
    cache = cache_with(keep=False)
    cache.acquire("a", SYSTEM)
    fill(cache, "a", SYSTEM)
    cache.release("a")
    assert cache.kept_tokens == 0 and cache.lengths[cache.acquire("b", SYSTEM + [1])] == 0


@torch.inference_mode()
def test_a_hot_swap_successor_never_reads_the_old_versions_slots_as_its_prefix_cache():
    cache = cache_with(slots=4)
    cache.acquire("old", SYSTEM + [1])
    fill(cache, "old", SYSTEM + [1])
    cache.release("old")  # the old version keeps SYSTEM in a free slot
    cache.acquire("running", [5] * 20)
    fill(cache, "running", [5] * 20)
    below, _ = cache.keep_only_rows(extra=0)
    assert cache.kept_tokens == 0  # what free slots kept went with them
    successor = SlotKVCache.over(
        SHAPE, below, [t[: below[0].shape[0]] for t in cache.values], capacity=64, keep_prefixes=True
    )
    assert successor.kept_tokens == 0 and successor.lengths[successor.acquire("new", SYSTEM + [2])] == 0


@pytest.mark.parametrize("keep", [True, False])
@torch.inference_mode()
def test_n_choices_fork_a_copy_of_their_prompts_row(keep):
    cache = cache_with(keep=keep)
    cache.acquire("p", SYSTEM)
    fill(cache, "p", SYSTEM)
    cache.fork("p", "p-1")
    child = cache.slot_of["p-1"]
    assert cache.lengths[child] == 40 and holds(cache, child, SYSTEM)
    assert cache.tokens[child] == (SYSTEM if keep else [])


# -- in the engine, on the demo model --------------------------------------------------------------

CONTEXT = "context: " + " ".join(["apple stone river moon sun"] * 12) + "\n"
QUESTIONS = ["reverse: apple stone river", "add: 27+58", "sort: river apple stone", "json: name=ana age=31"]


def greedy_run(engine, prompts: list[list[int]], *, together: bool) -> tuple[dict, dict]:
    """Tokens and cached prompt tokens per request: one after another (each finds the ones before
    it in free slots), or the second half admitted while the first half decodes (copied from
    running rows)."""
    from aieng.engine import GenerationRequest, SamplingParams

    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    requests = [GenerationRequest(f"r{i}", ids, params) for i, ids in enumerate(prompts)]
    events = []
    if together:
        half = len(requests) // 2
        events += engine.step(requests[:half]).events
        while any(r.request_id in engine.prefilled for r in requests[:half]):
            events += engine.step().events
        events += engine.step(requests[half:]).events
        while engine.num_running:
            events += engine.step().events
    else:
        for request in requests:
            events += engine.step([request]).events
            while engine.num_running:
                events += engine.step().events
    finals = {e.request_id: e for e in events if e.finished}
    return {k: e.token_ids for k, e in finals.items()}, {k: e.cached_tokens for k, e in finals.items()}


@pytest.mark.parametrize("together", [False, True], ids=["one-after-another", "while-running"])
def test_greedy_output_is_the_same_with_and_without_the_prefix_cache(demo, render, together):
    from aieng.engine import Engine, EngineConfig

    model, tokenizer = demo
    prompts = [tokenizer(render(CONTEXT + q))["input_ids"] for q in QUESTIONS]
    shared = common_prefix(prompts[0], prompts[1], 10**6)
    assert shared > 60
    off = Engine(model, tokenizer, config=EngineConfig(compile=False, prefix_cache=False))
    on = Engine(model, tokenizer, config=EngineConfig(compile=False, prefix_cache=True))
    tokens_off, cached_off = greedy_run(off, prompts, together=together)
    tokens_on, cached_on = greedy_run(on, prompts, together=together)
    assert tokens_on == tokens_off
    assert set(cached_off.values()) == {0}
    assert cached_on["r0"] == 0 and all(cached_on[f"r{i}"] >= shared for i in (2, 3))
    counts = on.prefix_counts()
    assert counts["hit"] == sum(cached_on.values()) and counts["miss"] == sum(map(len, prompts)) - counts["hit"]


def test_short_prompts_asked_again_are_whole_hits_with_the_same_greedy_output(demo, render):
    """Prompts shorter than ``MIN_REUSED_PREFIX`` (a repeated short question, a benchmark's loop)
    asked a second time prefill only their last token, and answer as without the cache."""
    from aieng.engine import Engine, EngineConfig

    model, tokenizer = demo
    prompts = [tokenizer(render(q))["input_ids"] for q in ("add: 2+3", "sort: oak ice", "reverse: egg")]
    assert all(len(p) < MIN_REUSED_PREFIX for p in prompts)
    off = Engine(model, tokenizer, config=EngineConfig(compile=False, prefix_cache=False))
    on = Engine(model, tokenizer, config=EngineConfig(compile=False, prefix_cache=True))
    tokens_off, _ = greedy_run(off, prompts, together=True)
    first, _ = greedy_run(on, prompts, together=True)
    again, cached = greedy_run(on, prompts, together=True)
    assert first == again == tokens_off
    assert cached == {f"r{i}": len(p) - 1 for i, p in enumerate(prompts)}


def test_a_follow_up_turn_reuses_the_conversation_so_far(demo, render):
    from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams

    model, tokenizer = demo
    engine = Engine(model, tokenizer, config=EngineConfig(compile=False))  # the served default: on
    params = SamplingParams(max_tokens=8, temperature=0)
    first = tokenizer(render(CONTEXT + QUESTIONS[0]))["input_ids"]
    events = engine.step([GenerationRequest("turn-1", first, params)]).events
    while engine.num_running:
        events += engine.step().events
    answer = next(e for e in events if e.finished).token_ids
    follow_up = first + list(answer) + tokenizer(" and add: 2+2")["input_ids"]
    events = engine.step([GenerationRequest("turn-2", follow_up, params)]).events
    while engine.num_running:
        events += engine.step().events
    assert next(e for e in events if e.finished).cached_tokens >= len(first) + len(answer) - 1


def test_a_burst_sharing_a_system_prompt_prefills_it_once(demo, render):
    """Four requests join in one step, none of them written yet: the first leads, the others wait
    for it to write the shared opening, copy it, and prefill only their questions."""
    from aieng.engine import Engine, EngineConfig, GenerationRequest, SamplingParams

    model, tokenizer = demo
    prompts = [tokenizer(render(CONTEXT + q))["input_ids"] for q in QUESTIONS]
    shared = common_prefix(prompts[0], prompts[1], 10**6)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    results = {}
    for on in (True, False):
        engine = Engine(model, tokenizer, config=EngineConfig(compile=False, prefix_cache=on, prefill_chunk_tokens=256))
        requests = [GenerationRequest(f"r{i}", ids, params) for i, ids in enumerate(prompts)]
        first = engine.step(requests)
        assert set(engine.leaders) == ({"r1", "r2", "r3"} if on else set())
        if on:  # the leader's prompt alone: the followers wait for it
            assert first.prefill_tokens == len(prompts[0])
        else:  # as many prompts as the budget holds, the shared opening computed in each
            assert first.prefill_tokens > len(prompts[0])
        events, steps = first.events, [first]
        while engine.num_running:
            steps.append(engine.step())
            events += steps[-1].events
        results[on] = {e.request_id: e for e in events if e.finished}
        # each step's share of the totals only ever adds (Prometheus counters cannot go down)
        assert all(v >= 0 for step in steps if step.prefix for v in step.prefix.values())
        if on:
            counts = engine.prefix_counts()
    assert {k: e.token_ids for k, e in results[True].items()} == {k: e.token_ids for k, e in results[False].items()}
    assert results[True]["r0"].cached_tokens == 0
    assert all(results[True][f"r{i}"].cached_tokens >= shared - MIN_REUSED_PREFIX for i in (1, 2, 3))
    assert counts["miss"] < len(prompts[0]) + 3 * (len(prompts[1]) - shared + MIN_REUSED_PREFIX)
