"""Which forward serves a model, decided from its config alone: aieng's native forward,
transformers' own forward, or neither (refused, with the reason and what to do instead).

A server that answers wrongly without an error is worse than one that refuses, so this is an
allowlist, not a blocklist: a configuration is served by a path only where that path has been
checked token for token against transformers' ``generate()`` on it. Every row of
``serving_table.ROWS`` (the table in docs/architecture.md) has such a greedy-parity test
(tests/engine/test_architectures.py); a model type or an option this module does not know is
refused by name rather than guessed at.

What can make a path wrong, option by option (transformers 5.x modeling code):

- **Native forward** (``native_llama``): llama, mistral and qwen2 are one decoder layer that differs
  only in which projections carry biases (read from the modules, all of them), GQA/MQA, head_dim,
  tied embeddings and rotary tables (from the model's own rotary module). Its MLP is SiLU-gated
  and its attention sees the whole row, so another activation, or a sliding window shorter than
  the served context, goes to the transformers forward.
- **Rotary types whose frequencies move with length** (``dynamic``, ``longrope``) are recomputed
  per forward call from the longest row in it: past their threshold one row's answer would depend
  on the rows batched with it (in ``generate()`` too). Below it they are the fixed frequencies
  every path computes alike; a context that reaches past it is refused.
- **Transformers forward** (``hf_runner``): the model's own forward over a left-padded dynamic
  cache; exact for full and sliding-window attention layers (the masks are in cache columns, and
  left padding keeps the distance between real tokens). Other layer kinds (linear attention,
  state-space) keep state the batch cache cannot join or split.

The store decides at register time from config.json (``inspect_folder``), before anything is
copied; the engine decides again when it picks its runner (``runner_choice``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aieng.errors import AiengError
from aieng.model_facts import DEFAULT_CONTEXT_LENGTH, context_length as config_context_length

#: The Llama family the native forward implements.
NATIVE_TYPES = ("llama", "mistral", "qwen2")
#: Model types served by transformers' own forward, each checked against generate() by a test.
TRANSFORMERS_TYPES = ("gpt2", "gpt_neox", "phi", "gemma")
#: Rotary types whose frequencies are fixed at load time.
FIXED_ROPE = ("default", "linear", "llama3", "yarn")
ATTENTION_LAYERS = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class ServingPath:
    kind: str  # "native" | "transformers" | "refused"
    reason: str

    @property
    def refused(self) -> bool:
        return self.kind == "refused"


def serving_path(config, *, context_length: int | None = None) -> ServingPath:
    """How ``config`` (a transformers ``PretrainedConfig``) is served for ``context_length``
    positions (default: the length the config advertises, as the engine enforces it)."""
    model_type = getattr(config, "model_type", None)
    context = context_length or config_context_length(config) or DEFAULT_CONTEXT_LENGTH
    if model_type not in NATIVE_TYPES + TRANSFORMERS_TYPES:
        checked = ", ".join(NATIVE_TYPES + TRANSFORMERS_TYPES)
        return ServingPath("refused", f"model type {model_type!r} has no greedy-parity check against transformers' "
                                      f"generate() in aieng, so its answers cannot be vouched for; serve a model of a "
                                      f"checked type ({checked})")
    problem = _quantized(config) or _rope_problem(config, context) or _layer_problem(config)
    if problem:
        return ServingPath("refused", problem)
    if model_type in TRANSFORMERS_TYPES:
        return ServingPath("transformers", f"{model_type} is not of the Llama family: transformers' own forward")
    gap = _native_gap(config, context)
    if gap:
        return ServingPath("transformers", gap)
    return ServingPath("native", "the native forward implements every option of this config")


def check_servable(config, *, context_length: int | None = None) -> ServingPath:
    """``serving_path``, raising ``AiengError`` (code ``unsupported_model``) when refused."""
    path = serving_path(config, context_length=context_length)
    if path.refused:
        raise AiengError(f"aieng refuses to serve this model: {path.reason}", code="unsupported_model")
    return path


def rope_parameters(config) -> list[dict]:
    """Every rotary parameter set of the config (one, or one per layer type)."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict):
        return []
    nested = [p for p in params.values() if isinstance(p, dict)]
    return nested if nested and len(nested) == len(params) else [params]


def _quantized(config) -> str | None:
    quantization = getattr(config, "quantization_config", None)
    if not quantization:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else type(quantization).__name__
    return (f"pre-quantized weights ({method!r}): both forwards read plain floating-point Linear weights; "
            "register the full-precision model (aieng serve --int8 quantizes it on load)")


def _rope_problem(config, context: int) -> str | None:
    for params in rope_parameters(config):
        rope_type = params.get("rope_type", "default")
        if rope_type == "dynamic" and context > config.max_position_embeddings:
            return (f"rope_type 'dynamic' rescales its frequencies whenever the longest row of a forward passes "
                    f"max_position_embeddings ({config.max_position_embeddings}), and {context} positions are "
                    "served: a row's answer would depend on the rows batched with it; serve at most "
                    "max_position_embeddings positions")
        if rope_type == "longrope" and context > params["original_max_position_embeddings"]:
            threshold = params["original_max_position_embeddings"]
            return (f"rope_type 'longrope' switches every position to its long factors once the longest row of a "
                    f"forward passes original_max_position_embeddings ({threshold}), and {context} positions are "
                    "served: a row's answer would depend on the rows batched with it; serve a version whose "
                    f"max_position_embeddings is at most {threshold}")
        if rope_type not in FIXED_ROPE + ("dynamic", "longrope"):
            return (f"rope_type {rope_type!r} is not one aieng has checked ({', '.join(FIXED_ROPE)}, dynamic, "
                    "longrope); serve a model with one of those")
        if config.model_type in NATIVE_TYPES and rope_type != "default" and params.get("partial_rotary_factor", 1.0) < 1:
            return (f"partial_rotary_factor {params['partial_rotary_factor']} with rope_type {rope_type!r}: "
                    f"transformers' {config.model_type} forward rotates whole heads and fails on it; fix the config")
    return None


def _layer_problem(config) -> str | None:
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - set(ATTENTION_LAYERS):
        return (f"layer types {sorted(kinds - set(ATTENTION_LAYERS))}: the batch cache holds attention keys and "
                "values only; serve a model whose layers are all attention layers")
    if config.model_type == "qwen2" and "sliding_attention" in kinds and config.sliding_window is None:
        return ("sliding_attention layers without a sliding_window (use_sliding_window is false): transformers' "
                "qwen2 forward fails on it; fix the config")
    return None


def sliding_window(config) -> int | None:
    """The window of the layers that attend to a window, as transformers' forward applies it."""
    if config.model_type == "mistral":  # every layer, whatever layer_types says
        return config.sliding_window
    if config.model_type == "qwen2" and "sliding_attention" in (config.layer_types or ()):
        return config.sliding_window
    return None


def _native_gap(config, context: int) -> str | None:
    """Why the native forward would not be exact for a Llama-family config (None: it is)."""
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}: the native MLP is SiLU-gated"
    window = sliding_window(config)
    if window is not None and window < context:
        return (f"sliding-window attention ({window} of {context} positions): the native forward attends to the "
                "whole row")
    return None
