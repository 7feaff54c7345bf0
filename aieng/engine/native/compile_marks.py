"""What the compiled decode stack needs from dynamo beyond ``torch.compile``: which sizes are
dynamic, a code object per model, and the settings its graphs are built under."""

from __future__ import annotations

import contextlib
import itertools
import types

import torch


def own_copy(fn):
    """``fn`` with a code object of its own. Dynamo keeps compiled graphs, their recompile limit and
    its record of which sizes have changed per code object: shared, a second model in the process
    (a hot-swapped version, a test) would count against the first's limit and turn the sizes that
    differ between the two (the weights') symbolic."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{next(_copies)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


_copies = itertools.count()


@contextlib.contextmanager
def compile_settings():
    """Wrap the calls that build the graphs (warm-up): only what ``mark_*_dynamic`` marks is
    dynamic (no automatic dynamic), and no duck shaping (a row count that happens to equal the slot
    count while compiling must not become a guard later steps fail). Compile-time only: patching
    torch's config around every step costs milliseconds."""
    with (
        torch._dynamo.config.patch(automatic_dynamic_shapes=False),
        torch.fx.experimental._config.patch(use_duck_shape=False),
    ):
        yield


def mark_step_dynamic(xd: torch.Tensor | None, xp: torch.Tensor | None, rotary: tuple, plan) -> None:
    """Mark the step's sizes dynamic: the decode row count and attention span, and the prompt
    chunks' count, width and span. A size of one stays a graph of its own (torch specialises sizes
    0 and 1): one decode row, one chunk. The runner pads chunks to at least 2 tokens."""
    cos_d, sin_d, cos_p, sin_p = rotary
    if xd is not None and xd.shape[0] >= 2:
        for t in (xd, cos_d, sin_d, plan.decode_pos, plan.decode_mask):
            torch._dynamo.mark_dynamic(t, 0)
    if plan.decode_mask is not None and plan.decode_mask.shape[-1] >= 2:
        torch._dynamo.mark_dynamic(plan.decode_mask, 3)
    if xp is None:
        return
    if xp.shape[0] >= 2:
        for t in (xp, cos_p, sin_p, plan.prefill_slots, plan.prefill_pos, plan.prefill_write, plan.prefill_mask):
            torch._dynamo.mark_dynamic(t, 0)
    if xp.shape[1] >= 2:
        for t in (xp, cos_p, sin_p, plan.prefill_pos, plan.prefill_write):
            torch._dynamo.mark_dynamic(t, 1)
        torch._dynamo.mark_dynamic(plan.prefill_mask, 2)
    if plan.prefill_mask.shape[-1] >= 2:
        torch._dynamo.mark_dynamic(plan.prefill_mask, 3)


def mark_cache_dynamic(cache) -> None:
    """Slots and capacity vary between the warm-up's scratch cache and the serving cache."""
    for t in cache.keys + cache.values:
        torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(t, 2)
