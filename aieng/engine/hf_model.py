"""What the engine needs from a transformers causal LM, and what it refuses.

transformers-specific details the engine depends on live here, so a newcomer reading the engine
sees prefill and decode, not version shims.
"""

from __future__ import annotations

import inspect

import torch

from aieng.errors import AiengError


def prepare_model(model: torch.nn.Module, *, quantize_int8: bool) -> torch.nn.Module:
    """Inference mode for the module (dropout off), optionally int8 dynamic quantization (CPU)."""
    model.eval()
    if quantize_int8:
        from aieng.engine.quantize import quantize_int8 as quantize

        model = quantize(model)
    return model


def refuse_sliding_window(config) -> None:
    """The right-aligned batch cache assumes full attention in every layer."""
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise AiengError("this model uses sliding-window or non-standard attention layers, which the aieng engine "
                         "does not batch yet; serve a full-attention model (Llama, Qwen2 without sliding window)",
                         code="unsupported_model")


def cache_kwarg(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache`` in model forwards; support both."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def pad_token_id(tokenizer, eos_ids: set[int]) -> int:
    """The id that fills left padding (never attended to): the tokenizer's pad, else an EOS id."""
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids))
