"""What the engine needs from a transformers causal LM (what it refuses is ``serving_path``'s call).

transformers-specific details the engine depends on live here, so a newcomer reading the engine
sees prefill and decode, not version shims.
"""

from __future__ import annotations

import inspect

import torch


def prepare_model(model: torch.nn.Module, *, quantize_int8: bool) -> torch.nn.Module:
    """Inference mode for the module (dropout off), optionally int8 dynamic quantization (CPU)."""
    model.eval()
    if quantize_int8:
        from aieng.engine.quantize import quantize_int8 as quantize

        model = quantize(model)
    return model


def cache_kwarg(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache`` in model forwards; support both."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def pad_token_id(tokenizer, eos_ids: set[int]) -> int:
    """The id that fills left padding (never attended to): the tokenizer's pad, else an EOS id."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids))
