"""An engine that takes over from another in a hot swap, on weights of the same layout.

What passes from the serving engine to its successor (``Engine(..., replacing=serving)``):

- **the weight-format plan and the one-row choice.** Measured again, under the load the old
  version is serving, they come out different, and so does the bf16 copy's presence, and then
  no compiled graph can be shared: the worker then compiles beside its serving engine, and every
  stream it serves stalls (``tests/server/process/test_hot_swap.py`` fails on that).
- **the compiled graphs** (weights are graph inputs, not constants): nothing is traced.
- **the KV cache's memory** (``kv_from_replaced=True``): the successor is built with no cache of
  its own. At the switch (``hand_over_cache``, on the old engine's thread between two of its
  steps) the old engine keeps only the slots its rows in flight and its queued requests need,
  moved to the top of the allocation, and the successor gets the slots below
  (``take_cache``). When the old one has finished, the successor grows over the whole
  allocation (``reclaim_cache``, on the successor's thread): its rows keep their slots, nothing
  is copied. So a swap holds two versions' weights and one cache, never two caches; on a GPU
  sized for one cache this is what makes a swap possible at all.

The price of one cache: while the old version finishes, the new one has the slots the old is not
using. A worker that was full at the switch admits new requests as its old rows finish; they
wait in the queue meanwhile (``Scheduler`` asks the engine how many rows it holds now).

The transformers forward has no static cache (its cache grows with the rows in flight), so two
engines on it hold together what one would; it does not take part in any of this.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from aieng.engine.native.compile_marks import mark_cache_dynamic
from aieng.engine.native.slots import SlotKVCache


def weight_layout(model) -> tuple:
    """Every parameter's name, shape and dtype: two models with equal layouts run the same graphs."""
    return tuple((name, tuple(p.shape), p.dtype) for name, p in model.named_parameters())


def donor_runner(replacing, model):
    """The native runner of the engine being replaced when ``model`` has its weight layout, else None."""
    donor = replacing.runner if replacing is not None else None
    if donor is not None and donor.kind == "native" and weight_layout(donor.net.model) == weight_layout(model):
        return donor
    return None


def awaits_kv_cache(engine) -> bool:
    """True for a successor built to work in its predecessor's KV memory, before ``take_cache``."""
    return engine.runner.awaits_cache


@dataclass
class CacheHandover:
    """The old engine's allocation (``keys``/``values``, per layer), and the slots below what it
    kept (``free_keys``/``free_values``) for the successor."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    free_keys: list[torch.Tensor]
    free_values: list[torch.Tensor]
    kept_by_old: int

    @property
    def given(self) -> int:
        return self.free_keys[0].shape[0]


def hand_over_cache(old_engine, *, queued: int) -> CacheHandover:
    """On the old engine's thread, between steps: keep the slots of the rows in flight and of
    ``queued`` requests still to be admitted; hand the rest over."""
    cache = old_engine.runner.cache
    keys, values = list(cache.keys), list(cache.values)
    free_keys, free_values = cache.keep_only_rows(extra=queued)
    return CacheHandover(keys, values, free_keys, free_values, kept_by_old=cache.slots)


def take_cache(engine, handover: CacheHandover) -> None:
    """Before the successor's thread starts: its cache is the slots the old engine gave up."""
    runner = engine.runner
    waiting = runner.cache  # 0 slots, built with the engine's prefix-cache setting; nothing kept
    runner.cache = SlotKVCache.over(
        waiting.shape,
        handover.free_keys,
        handover.free_values,
        capacity=waiting.capacity,
        keep_prefixes=waiting.keep_prefixes,
    )
    mark_cache_dynamic(runner.cache)
    runner.awaits_cache = False


def own_cache(engine, slots: int) -> None:
    """The fallback when a hand-over fails: a cache of the successor's own, as a fresh engine has."""
    runner = engine.runner
    runner.cache = _fresh_cache(runner, slots, runner.cache.capacity)
    runner.awaits_cache = False


def _fresh_cache(runner, slots: int, capacity: int) -> SlotKVCache:
    shape, keep = runner.cache.shape, runner.cache.keep_prefixes
    cache = SlotKVCache(shape, slots=slots, capacity=capacity, device=runner.device, keep_prefixes=keep)
    mark_cache_dynamic(cache)  # like the serving cache: the graphs run on it as they are
    return cache


def reclaim_cache(engine, handover: CacheHandover) -> None:
    """On the successor's thread, once the old engine's thread has ended: the whole allocation."""
    engine.runner.cache.grow(handover.keys, handover.values)


@contextlib.contextmanager
def scratch_cache(runner, *, rows: int = 2, capacity: int = 64):
    """A small cache of its own while a cache-awaiting successor warms up (it has 0 slots);
    2 rows, marked dynamic like the serving cache, so the shared graphs run on it as they are."""
    if not runner.awaits_cache:
        yield
        return
    waiting = runner.cache
    runner.cache = _fresh_cache(runner, rows, capacity)
    try:
        yield
    finally:
        runner.cache = waiting
