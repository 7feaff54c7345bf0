"""The rows of docs/models.md's "Which models are served how" table: one small config per
architecture and option, each decided by ``serving_path``.

The table is generated from these rows (``python -m aieng.engine.serving_table`` prints it), and
the tests hold both ends: the block in docs/models.md must be this output, every row's
``kind`` must be what ``serving_path`` decides for its config, and every row served by a forward
has a greedy-parity test against transformers' ``generate()`` on a random-weight model of exactly
that config (tests/engine/test_architectures.py). So the table cannot claim a path the code does
not take, nor one nobody checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aieng.engine.serving_path import serving_path

#: Each model type's dimensions, small enough that a random-weight model builds in milliseconds.
#: 256 positions, so a window of 8 is shorter than the context and 256 is not.
TINY = {
    "llama": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    ),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "gpt_neox": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256
    ),
    "phi": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256
    ),
    "gemma": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
    ),
    "opt": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256),
    "falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256),
    "gptj": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, rotary_dim=8),
    "codegen": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_ctx=256, rotary_dim=8),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "bloom": dict(hidden_size=64, n_layer=2, n_head=4),
    # Local attention on alternate layers, its window the whole context unless a row narrows it.
    "gpt_neo": dict(
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        max_position_embeddings=256,
        attention_types=[[["global", "local"], 1]],
        window_size=256,
    ),
    "xglm": dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=128, max_position_embeddings=256),
}
TINY["mistral"] = dict(TINY["llama"], sliding_window=None)
TINY["qwen2"] = TINY["llama"]
#: Llama-shaped types: the Llama dimensions plus what each needs to build (and head_dim 16 where
#: its default would not be hidden/heads).
for _type, _extra in {
    "qwen3": dict(head_dim=16),
    "phi3": {},
    "olmo": {},
    "olmo2": {},
    "stablelm": {},
    "cohere": {},
    "starcoder2": {},
    "glm": dict(head_dim=16),
    "glm4": dict(head_dim=16),
    "ernie4_5": dict(head_dim=16),
    "granite": dict(embedding_multiplier=2.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0),
    "smollm3": dict(no_rope_layers=[1, 0]),  # the second layer without rotary (SmolLM3: every fourth)
    # MoE: every layer sparse, experts narrower than the dense MLP
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "phimoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64
    ),
    "qwen3_moe": dict(head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "ernie4_5_moe": dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32),
    "glm4_moe": dict(
        head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        first_k_dense_replace=0,
        n_group=1,
        topk_group=1,
    ),
    # multi-head latent attention: 4 KV heads (one per query head), keys 24 wide, values 16
    "deepseek_v2": dict(
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        first_k_dense_replace=1,
    ),
    "deepseek_v3": dict(
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
    ),
}.items():
    TINY[_type] = dict(TINY["llama"], **_extra)
#: Interleaved sliding-window and full-attention layers: one of each, the window the whole
#: context (the plain model's math) unless a row narrows it. Untied embeddings where tied ones
#: (and sandwich norms) make a two-layer random model repeat one token.
_INTERLEAVED = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=256)
#: A hybrid: Gated DeltaNet (linear attention) layers beside full attention, refused.
TINY["qwen3_next"] = dict(
    TINY["llama"],
    head_dim=16,
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)
for _type, _extra in {
    "gemma2": dict(head_dim=16, tie_word_embeddings=False),
    "gemma3_text": dict(head_dim=16, tie_word_embeddings=False),
    "cohere2": {},
    "olmo3": {},
    "exaone4": {},
    "ministral": dict(head_dim=16),
    "gpt_oss": dict(
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    ),
}.items():
    TINY[_type] = dict(TINY["llama"], **_INTERLEAVED, **_extra)


def _rope(rope_type: str, **params) -> dict:
    return {"rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, **params}}


@dataclass(frozen=True)
class Row:
    model_type: str
    configuration: str  # what the row varies, as a reader looks it up
    kind: str  # what serving_path decides: native | transformers | refused
    overrides: dict = field(default_factory=dict)


ROWS = (
    Row("llama", "plain: GQA (4 heads, 2 KV heads), no biases, untied embeddings", "native"),
    Row("llama", "attention_bias (q, k, v and o projections)", "native", {"attention_bias": True}),
    Row("llama", "mlp_bias (gate, up and down projections)", "native", {"mlp_bias": True}),
    Row("llama", "tied embeddings", "native", {"tie_word_embeddings": True}),
    Row("llama", "MQA (1 KV head)", "native", {"num_key_value_heads": 1}),
    Row("llama", "head_dim 32 != hidden/heads 16", "native", {"head_dim": 32}),
    Row("llama", "rope linear", "native", _rope("linear", factor=2.0)),
    Row(
        "llama",
        "rope dynamic (fixed up to max_position_embeddings, the served context)",
        "native",
        _rope("dynamic", factor=2.0),
    ),
    Row(
        "llama",
        "rope llama3",
        "native",
        _rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64),
    ),
    Row("llama", "rope yarn", "native", _rope("yarn", factor=4.0, original_max_position_embeddings=64)),
    Row(
        "llama",
        "rope longrope, context <= original_max_position_embeddings",
        "native",
        _rope(
            "longrope",
            short_factor=[1.0 + i / 8 for i in range(8)],
            long_factor=[4.0] * 8,
            factor=1.0,
            original_max_position_embeddings=256,
            attention_factor=1.2,
        ),
    ),
    Row(
        "llama",
        "rope longrope, context > original_max_position_embeddings",
        "refused",
        _rope(
            "longrope", short_factor=[1.0] * 8, long_factor=[4.0] * 8, factor=4.0, original_max_position_embeddings=64
        ),
    ),
    Row(
        "llama",
        "scaled rope with partial_rotary_factor < 1",
        "refused",
        _rope("linear", factor=2.0, partial_rotary_factor=0.5),
    ),
    Row("llama", "hidden_act gelu", "transformers", {"hidden_act": "gelu"}),
    Row(
        "llama",
        "pre-quantized weights (quantization_config)",
        "refused",
        {"quantization_config": {"quant_method": "gptq", "bits": 4}},
    ),
    Row("mistral", "no sliding window", "native"),
    Row("mistral", "sliding window >= context (never narrower than a row)", "native", {"sliding_window": 256}),
    Row("mistral", "sliding window 8 < context", "transformers", {"sliding_window": 8}),
    Row("qwen2", "q/k/v biases, full attention", "native"),
    Row(
        "qwen2",
        "use_sliding_window: window 8 on layers from max_window_layers",
        "transformers",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    Row("gpt2", "learned positions, biased projections, LayerNorm", "transformers"),
    Row("gpt_neox", "partial rotary, parallel residual", "transformers"),
    Row("phi", "partial rotary, parallel attention and MLP", "transformers"),
    Row("gemma", "MQA, GeGLU, scaled embeddings", "transformers"),
    Row(
        "gemma",
        "use_bidirectional_attention (an encoder: EmbeddingGemma)",
        "refused",
        {"use_bidirectional_attention": True},
    ),
    # Llama-like, with what the native forward lacks
    Row("qwen3", "per-head q/k RMSNorm, GQA, full attention", "transformers"),
    Row(
        "qwen3",
        "use_sliding_window: window 8 on layers from max_window_layers",
        "transformers",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    Row(
        "qwen3",
        "sliding_attention layers without a sliding_window",
        "refused",
        {"layer_types": ["sliding_attention", "full_attention"]},
    ),
    Row("phi3", "fused qkv and gate/up projections", "transformers"),
    Row("phi3", "sliding window 8 (Phi-3-mini-4k: 2047 of 4096)", "transformers", {"sliding_window": 8}),
    Row(
        "phi3",
        "partial rotary 0.75, rope longrope, context <= original_max_position_embeddings (Phi-4-mini "
        "at <= 4096 positions)",
        "transformers",
        {
            "original_max_position_embeddings": 256,
            **_rope(
                "longrope",
                partial_rotary_factor=0.75,
                short_factor=[1.0 + i / 6 for i in range(6)],
                long_factor=[4.0] * 6,
            ),
        },
    ),
    Row(
        "phi3",
        "rope longrope, context > original_max_position_embeddings (Phi-3.5-mini, Phi-4-mini)",
        "refused",
        {"original_max_position_embeddings": 64, **_rope("longrope", short_factor=[1.0] * 8, long_factor=[4.0] * 8)},
    ),
    Row("olmo", "LayerNorm without parameters", "transformers"),
    Row("olmo2", "q/k RMSNorm over all heads, norms after attention and MLP", "transformers"),
    Row("granite", "embedding, attention, residual and logit multipliers", "transformers"),
    Row("stablelm", "partial rotary 0.25, LayerNorm", "transformers"),
    Row(
        "stablelm",
        "q/k/v biases, per-head q/k LayerNorm, parallel residual (StableLM 2 12B)",
        "transformers",
        {"use_qkv_bias": True, "qk_layernorm": True, "use_parallel_residual": True},
    ),
    Row("cohere", "parallel attention and MLP, interleaved rotary, logit_scale", "transformers"),
    Row("cohere", "use_qk_norm (Command R+)", "transformers", {"use_qk_norm": True}),
    Row("smollm3", "no rotary on some layers (no_rope_layers)", "transformers"),
    Row("starcoder2", "biased projections, LayerNorm, GELU MLP", "transformers"),
    Row("starcoder2", "sliding window 8 (StarCoder2: 4096 of 16384)", "transformers", {"sliding_window": 8}),
    Row("glm", "partial interleaved rotary, fused gate/up", "transformers"),
    Row("glm4", "partial interleaved rotary, norms after attention and MLP", "transformers"),
    Row("ernie4_5", "interleaved rotary", "transformers"),
    # interleaved sliding-window and full-attention layers
    Row("gemma2", "sandwich norms, soft-capped attention and logits, window >= context", "transformers"),
    Row("gemma2", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    Row("gemma3_text", "q/k norms, local and global rotary bases, window >= context", "transformers"),
    Row("gemma3_text", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    Row("cohere2", "no rotary on full-attention layers, window >= context", "transformers"),
    Row("cohere2", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    Row("olmo3", "q/k RMSNorm, window >= context", "transformers"),
    Row("olmo3", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    Row("exaone4", "q/k norms, norms after attention and MLP, window >= context", "transformers"),
    Row("exaone4", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    Row("ministral", "window >= context", "transformers"),
    Row("ministral", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    # mixture of experts: each token routed on its own, rows of different lengths batched
    Row("mixtral", "MoE: 4 experts, top 2", "transformers"),
    Row("mixtral", "sliding window 8", "transformers", {"sliding_window": 8}),
    Row("qwen2_moe", "MoE: 8 experts, top 2, and a gated shared expert", "transformers"),
    Row("qwen3_moe", "MoE: 8 experts, top 2 (renormalised), q/k norm", "transformers"),
    Row("phimoe", "MoE: 4 experts, top 2 by sparsemixer", "transformers"),
    Row("olmoe", "MoE: 8 experts, top 2, q/k norm", "transformers"),
    Row("granitemoe", "MoE: 4 experts, top 2, multipliers", "transformers"),
    Row("ernie4_5_moe", "MoE: 4 experts, top 2", "transformers"),
    Row("glm4_moe", "MoE: 4 experts, top 2, and a shared expert; partial rotary", "transformers"),
    Row(
        "deepseek_v2",
        "multi-head latent attention (keys 24 wide, values 16), MoE with a shared expert, dense first layer",
        "transformers",
    ),
    Row("deepseek_v3", "latent attention with q LoRA, group-limited MoE with a shared expert", "transformers"),
    Row("gpt_oss", "attention sinks, MoE: 4 experts, top 2, rope yarn, window >= context", "transformers"),
    Row("gpt_oss", "sliding window 8 on alternate layers", "transformers", {"sliding_window": 8}),
    # older architectures
    Row("falcon", "rotary, multi-query, parallel attention and MLP", "transformers"),
    Row("falcon", "ALiBi instead of rotary", "transformers", {"alibi": True}),
    Row(
        "falcon",
        "new_decoder_architecture: grouped KV heads (Falcon-40B, 180B)",
        "transformers",
        {"new_decoder_architecture": True, "num_kv_heads": 2},
    ),
    Row("gptj", "interleaved partial rotary, parallel residual", "transformers"),
    Row("codegen", "fused qkv, interleaved partial rotary", "transformers"),
    Row("gpt_neo", "local attention on alternate layers, window >= context", "transformers"),
    Row("gpt_neo", "local attention window 8", "transformers", {"window_size": 8}),
    Row("opt", "learned positions (offset 2), ReLU MLP", "transformers"),
    Row("bloom", "ALiBi, LayerNorm after the embedding", "transformers"),
    Row("gpt_bigcode", "multi-query attention, learned positions", "transformers"),
    # refused
    Row("qwen3_next", "linear-attention (Gated DeltaNet) layers beside full attention", "refused"),
    Row("xglm", "any model type not listed above", "refused"),
)


def row_config(row: Row, **extra):
    """The row's transformers config at the tiny size; ``extra`` (vocabulary, special token ids)
    is what a test's tokenizer needs and never changes the decision."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[row.model_type](**{**TINY[row.model_type], **row.overrides, **extra})


def serving_markdown_table() -> str:
    """The table as docs/models.md holds it, with ``serving_path``'s reason for each row."""
    lines = ["| model type | configuration | served by | why (`serving_path`) |", "| --- | --- | --- | --- |"]
    for row in ROWS:
        path = serving_path(row_config(row))
        reason = path.reason.replace("|", "\\|")
        lines.append(f"| `{row.model_type}` | {row.configuration} | {path.kind} | {reason} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(serving_markdown_table())
