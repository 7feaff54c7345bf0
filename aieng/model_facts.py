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


def head_dim(config) -> int:
    """Each attention head's width: the config's ``head_dim`` where it names one (it may differ
    from hidden/heads, as in Gemma and Qwen3), else hidden size over query heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_heads(config) -> int:
    """Key/value heads: fewer than the query heads under grouped- or multi-query attention."""
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def kv_bytes_per_token(config, element_bytes: int) -> int:
    """What one token's keys and values take across every layer, at ``element_bytes`` per value:
    the unit of every KV cache budget (the native slots, a worker's memory, a GPU's share)."""
    return 2 * config.num_hidden_layers * kv_heads(config) * head_dim(config) * element_bytes
