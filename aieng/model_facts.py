"""Facts about a Hugging Face model that serving, evaluation and the store must agree on.

One copy each, because two copies drift: when serving and evaluation read the end-of-sequence
ids differently, the server stops on a token the evaluation never stopped on (or the reverse),
and the numbers that gate a release no longer describe what is served.
"""

from __future__ import annotations

#: Used only when a config names no context length at all (rare: every current architecture does).
DEFAULT_CONTEXT_LENGTH = 2048

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def context_length(config) -> int | None:
    """The context length a config advertises, or None. ``config``: a ``PretrainedConfig`` or its dict.

    Multimodal configs nest the language model's under ``text_config``.
    """
    if not isinstance(config, dict):
        config = config.to_dict()
    for key in _CONTEXT_KEYS:
        if isinstance(config.get(key), int):
            return config[key]
    text = config.get("text_config")
    return context_length(text) if isinstance(text, dict) else None


def model_context_length(model) -> int:
    """What the engine and the server enforce for ``model``: its config's length, or the default."""
    return context_length(model.config) or DEFAULT_CONTEXT_LENGTH


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that ends a reply: the generation config's (an int or a list) and the tokenizer's.

    The union, because chat models often end a turn with a token (``<|im_end|>``) that only the
    generation config names, while the tokenizer's ``eos_token`` is the document end.
    """
    ids: set[int] = set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(i) for i in configured if i is not None)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("neither the tokenizer nor the generation config defines an end-of-sequence token")
    return ids
