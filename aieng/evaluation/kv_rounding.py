"""The bf16 KV cache's effect on quality, measured on transformers' forward (``aieng eval
--kv-cache-dtype bfloat16``).

The engine with a bf16 cache (``AIENG_KV_CACHE_DTYPE``) stores every key after its rotary
embedding, and every value, rounded to bf16, and attends to those: the current token's too, since
it is written before it is read. The held-out suite runs transformers' ``generate()`` and a full
forward for perplexity, so the same rounding is applied there: the model module's
``apply_rotary_pos_emb`` returns its keys rounded, and each ``v_proj`` output is rounded. Queries,
weights and every other activation stay as they are, as in the engine.
"""

from __future__ import annotations

import contextlib
import sys

import torch


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


@contextlib.contextmanager
def bf16_kv_rounding(model):
    """Within the block, ``model`` attends to keys and values rounded to bf16 as a bf16 KV cache
    holds them. Llama-family models only (the native forward's, the only one with the option)."""
    layers = model.model.layers
    module = sys.modules[type(layers[0].self_attn).__module__]
    original = getattr(module, "apply_rotary_pos_emb", None)
    if original is None:
        raise ValueError(f"{module.__name__} has no apply_rotary_pos_emb: the bf16 KV cache is for Llama-family models")

    def rounded_rotary(q, k, *args, **kwargs):
        q_embed, k_embed = original(q, k, *args, **kwargs)
        return q_embed, _rounded(k_embed)

    hooks = [layer.self_attn.v_proj.register_forward_hook(lambda _m, _i, out: _rounded(out)) for layer in layers]
    module.apply_rotary_pos_emb = rounded_rotary
    try:
        yield model
    finally:
        module.apply_rotary_pos_emb = original
        for hook in hooks:
            hook.remove()
