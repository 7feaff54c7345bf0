"""Which forward serves a model, decided from its config alone: aieng's native forward,
transformers' own forward, or neither (refused, with the reason and what to do instead).

A server that answers wrongly without an error is worse than one that refuses, so this is an
allowlist, not a blocklist: a configuration is served by a path only where that path has been
checked token for token against transformers' ``generate()`` on it. Every row of
``serving_table.ROWS`` (the table in docs/models.md) has such a greedy-parity test
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
  cache; exact for full and sliding-window attention layers, interleaved or not (the masks are in
  cache columns, and left padding keeps the distance between real tokens), whatever the layer
  computes per token: soft-capped logits, attention sinks, q/k norms, layers without rotary,
  ALiBi, multi-head latent attention (keys and values of different widths), and mixture-of-experts
  routers that route each token on its own (top-k, no capacity limit: no token's experts depend
  on its batch-mates; checked with rows of different lengths batched). Other layer kinds (linear
  attention, state-space, convolution) keep a recurrent state the batch cache cannot join or split,
  and left padding would run through it.
- **Options transformers' own forward gets wrong or fails on**, refused whatever the model type:
  ``sliding_attention`` layers with no ``sliding_window`` (or 0), and ``use_bidirectional_attention``
  (an encoder such as EmbeddingGemma; gemma's sdpa forward attends bidirectionally only when a
  batch has no padding, so ``generate()`` itself answers differently batched and alone).

The store decides at register time from config.json (``inspect_folder``), before anything is
copied; the engine decides again when it picks its runner (``runner_choice``).
"""

from __future__ import annotations

from dataclasses import dataclass

from aieng.errors import AiengError
from aieng.model_facts import DEFAULT_CONTEXT_LENGTH
from aieng.model_facts import context_length as config_context_length

#: The Llama family the native forward implements.
NATIVE_TYPES = ("llama", "mistral", "qwen2")
#: Model types served by transformers' own forward, each checked against generate() by a test
#: (one row or more per type in ``serving_table.ROWS``).
TRANSFORMERS_TYPES = (
    "gpt2",
    "gpt_neox",
    "phi",
    "gemma",
    # Llama-like decoders with something the native forward lacks (q/k norms, other norms or
    # multipliers, partial or interleaved rotary, layers without rotary, fused projections)
    "qwen3",
    "phi3",
    "olmo",
    "olmo2",
    "granite",
    "stablelm",
    "cohere",
    "smollm3",
    "starcoder2",
    "glm",
    "glm4",
    "ernie4_5",
    # interleaved sliding-window and full-attention layers
    "gemma2",
    "gemma3_text",
    "cohere2",
    "olmo3",
    "exaone4",
    "ministral",
    # mixture of experts
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "phimoe",
    "olmoe",
    "granitemoe",
    "deepseek_v2",
    "deepseek_v3",
    "glm4_moe",
    "ernie4_5_moe",
    "gpt_oss",
    # older architectures: learned positions, ALiBi, parallel blocks
    "falcon",
    "gptj",
    "gpt_neo",
    "opt",
    "bloom",
    "gpt_bigcode",
    "codegen",
)
#: Rotary types whose frequencies are fixed at load time.
FIXED_ROPE = ("default", "linear", "llama3", "yarn")
ATTENTION_LAYERS = ("full_attention", "sliding_attention")
#: Layer kinds of hybrid models that keep a recurrent state instead of (or beside) attention keys.
STATE_LAYERS = ("linear_attention", "mamba", "conv", "hybrid", "recurrent")


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
        return ServingPath("refused", _unchecked(config))
    problem = (
        _quantized(config) or _rope_problem(config, context) or _layer_problem(config) or _attention_problem(config)
    )
    if problem:
        return ServingPath("refused", problem)
    if model_type in TRANSFORMERS_TYPES:
        return ServingPath(
            "transformers",
            f"{model_type} is not of the Llama family the native forward implements "
            f"({', '.join(NATIVE_TYPES)}): transformers' own forward",
        )
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
    return (
        f"pre-quantized weights ({method!r}): both forwards read plain floating-point Linear weights; "
        "register the full-precision model (aieng serve --int8 quantizes it on load)"
    )


def _rope_problem(config, context: int) -> str | None:
    for params in rope_parameters(config):
        rope_type = params.get("rope_type", "default")
        if rope_type == "dynamic" and context > config.max_position_embeddings:
            return (
                f"rope_type 'dynamic' rescales its frequencies whenever the longest row of a forward passes "
                f"max_position_embeddings ({config.max_position_embeddings}), and {context} positions are "
                "served: a row's answer would depend on the rows batched with it; serve at most "
                "max_position_embeddings positions"
            )
        if rope_type == "longrope" and context > params["original_max_position_embeddings"]:
            threshold = params["original_max_position_embeddings"]
            return (
                f"rope_type 'longrope' switches every position to its long factors once the longest row of a "
                f"forward passes original_max_position_embeddings ({threshold}), and {context} positions are "
                "served: a row's answer would depend on the rows batched with it; serve a version whose "
                f"max_position_embeddings is at most {threshold}"
            )
        if rope_type not in FIXED_ROPE + ("dynamic", "longrope"):
            return (
                f"rope_type {rope_type!r} is not one aieng has checked ({', '.join(FIXED_ROPE)}, dynamic, "
                "longrope); serve a model with one of those"
            )
        if (
            config.model_type in NATIVE_TYPES
            and rope_type != "default"
            and params.get("partial_rotary_factor", 1.0) < 1
        ):
            return (
                f"partial_rotary_factor {params['partial_rotary_factor']} with rope_type {rope_type!r}: "
                f"transformers' {config.model_type} forward rotates whole heads and fails on it; fix the config"
            )
    return None


def _unchecked(config) -> str:
    """Why a model type outside both lists is refused: what is known about it, else that it is unchecked."""
    model_type = getattr(config, "model_type", None)
    text = getattr(config, "text_config", None)
    if text is not None and getattr(text, "model_type", model_type) != model_type:
        return (
            f"model type {model_type!r} is a multimodal checkpoint (its language model is a "
            f"{text.model_type!r} config nested in text_config): aieng serves text-only causal LMs; serve a "
            f"text-only checkpoint of the language model (model_type {text.model_type!r})"
        )
    state = _state_layers(config)
    if state:
        return (
            f"model type {model_type!r} has {'/'.join(state)} layers, which keep a recurrent state: the batch "
            "cache holds attention keys and values only (it cannot join, split or left-pad that state); serve "
            "a model whose layers are all attention layers"
        )
    checked = ", ".join(NATIVE_TYPES + TRANSFORMERS_TYPES)
    return (
        f"model type {model_type!r} has no greedy-parity check against transformers' generate() in aieng, so "
        f"its answers cannot be vouched for; serve a model of a checked type ({checked})"
    )


def _state_layers(config) -> list[str]:
    kinds = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None) or ()
    return sorted({k for k in kinds if isinstance(k, str) and k in STATE_LAYERS})


def _layer_problem(config) -> str | None:
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds - set(ATTENTION_LAYERS):
        return (
            f"layer types {sorted(kinds - set(ATTENTION_LAYERS))}: the batch cache and aieng's checks cover "
            "full and sliding-window attention layers only (a recurrent state cannot be joined or split, "
            "chunked attention is unchecked); serve a model whose layers are all of those"
        )
    if "sliding_attention" in kinds and not getattr(config, "sliding_window", None):
        return (
            f"sliding_attention layers without a sliding_window ({getattr(config, 'sliding_window', None)!r}; "
            f"use_sliding_window false?): transformers' {config.model_type} forward fails on it; fix the config"
        )
    return None


def _attention_problem(config) -> str | None:
    if getattr(config, "use_bidirectional_attention", False):
        return (
            "use_bidirectional_attention: an encoder configuration (such as EmbeddingGemma), not a text "
            "generator, and transformers applies it inconsistently (gemma's sdpa forward attends "
            "bidirectionally only when a batch has no padding), so an answer would depend on the rows batched "
            "with it; serve a causal (generation) checkpoint"
        )
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
        return (
            f"sliding-window attention ({window} of {context} positions): the native forward attends to the whole row"
        )
    return None
