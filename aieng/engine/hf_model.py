"""What the engine needs from a transformers causal LM (what it refuses is ``serving_path``'s call).

transformers-specific details the engine depends on live here, so a newcomer reading the engine
sees prefill and decode, not version shims.
"""

from __future__ import annotations

import inspect

import torch


def prepare_model(model: torch.nn.Module, *, quantize_int8: bool, context_length: int | None) -> torch.nn.Module:
    """A model ``serving_path`` serves (refused first, with the reason, before anything reads its
    config: a multimodal checkpoint has no top-level ``vocab_size``), in inference mode (dropout
    off), optionally with int8 dynamic quantization (CPU)."""
    from aieng.engine.serving_path import check_servable

    check_servable(model.config, context_length=context_length)
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
