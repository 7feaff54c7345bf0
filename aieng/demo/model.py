"""The demo model's architecture: a small Llama (RMSNorm, RoPE, SwiGLU, grouped-query ready).

Llama because it is the family users bring next (Llama / Qwen / Mistral share this layout), so
the loader, the engine and the notebooks exercise the same code paths on the demo model as on
a real one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: the shape registry reads ModelDims without torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True, kw_only=True)
class ModelDims:
    """Shape of the network; the vocabulary size comes from the trained tokenizer.

    The defaults are the shipped demo model's (``DemoBuildConfig().dims``). Width is the
    expensive knob: at the demo's training budget a wider model gets fewer optimizer steps and
    learns *less*; the copying circuits the corpus tasks need want steps, not width. The large
    initialisation (0.08 instead of Hugging Face's 0.02) is what lets those circuits form within
    the default step budget at all.
    """

    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 4
    #: Context length advertised in config.json. Training documents are short (< 64 tokens);
    #: 512 keeps the serving limits (prompt too long, KV budget) realistic to exercise.
    context_length: int = 512
    rope_theta: float = 10000.0
    initializer_range: float = 0.08
    tie_word_embeddings: bool = True


def llama_config(dims: ModelDims, *, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> LlamaConfig:
    """A ``LlamaConfig`` for ``dims`` with the tokenizer's vocabulary and special ids."""
    from transformers import LlamaConfig

    if dims.hidden_size % dims.num_heads:
        raise ValueError(f"hidden_size {dims.hidden_size} is not a multiple of num_heads {dims.num_heads}")
    if dims.num_heads % dims.num_kv_heads:
        raise ValueError(f"num_heads {dims.num_heads} is not a multiple of num_kv_heads {dims.num_kv_heads}")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_heads,
        num_key_value_heads=dims.num_kv_heads,
        max_position_embeddings=dims.context_length,
        rope_parameters={"rope_type": "default", "rope_theta": dims.rope_theta},
        tie_word_embeddings=dims.tie_word_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        initializer_range=dims.initializer_range,
        rms_norm_eps=1e-5,
        use_cache=True,
    )


def new_model(config: LlamaConfig) -> LlamaForCausalLM:
    """A freshly initialised model (seed torch before calling for reproducible weights)."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(config)


def generation_config(*, bos_id: int, eos_id: int, pad_id: int) -> GenerationConfig:
    """Defaults saved as generation_config.json: stop at <|end|>, pad with <|pad|>, greedy."""
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id, do_sample=False)
