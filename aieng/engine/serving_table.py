"""The rows of docs/architecture.md's "Which models are served how" table: one small config per
architecture and option, each decided by ``serving_path``.

The table is generated from these rows (``python -m aieng.engine.serving_table`` prints it), and
the tests hold both ends: the block in docs/architecture.md must be this output, every row's
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
    "llama": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "gpt_neox": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=256),
    "phi": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=256),
    "gemma": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, max_position_embeddings=256),
    "opt": dict(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256),
}
TINY["mistral"] = dict(TINY["llama"], sliding_window=None)
TINY["qwen2"] = TINY["llama"]


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
    Row("llama", "rope dynamic (fixed up to max_position_embeddings, the served context)", "native",
        _rope("dynamic", factor=2.0)),
    Row("llama", "rope llama3", "native", _rope("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                original_max_position_embeddings=64)),
    Row("llama", "rope yarn", "native", _rope("yarn", factor=4.0, original_max_position_embeddings=64)),
    Row("llama", "rope longrope, context <= original_max_position_embeddings", "native",
        _rope("longrope", short_factor=[1.0 + i / 8 for i in range(8)], long_factor=[4.0] * 8, factor=1.0,
              original_max_position_embeddings=256, attention_factor=1.2)),
    Row("llama", "rope longrope, context > original_max_position_embeddings", "refused",
        _rope("longrope", short_factor=[1.0] * 8, long_factor=[4.0] * 8, factor=4.0,
              original_max_position_embeddings=64)),
    Row("llama", "scaled rope with partial_rotary_factor < 1", "refused",
        _rope("linear", factor=2.0, partial_rotary_factor=0.5)),
    Row("llama", "hidden_act gelu", "transformers", {"hidden_act": "gelu"}),
    Row("llama", "pre-quantized weights (quantization_config)", "refused",
        {"quantization_config": {"quant_method": "gptq", "bits": 4}}),
    Row("mistral", "no sliding window", "native"),
    Row("mistral", "sliding window >= context (never narrower than a row)", "native", {"sliding_window": 256}),
    Row("mistral", "sliding window 8 < context", "transformers", {"sliding_window": 8}),
    Row("qwen2", "q/k/v biases, full attention", "native"),
    Row("qwen2", "use_sliding_window: window 8 on layers from max_window_layers", "transformers",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    Row("gpt2", "learned positions, biased projections, LayerNorm", "transformers"),
    Row("gpt_neox", "partial rotary, parallel residual", "transformers"),
    Row("phi", "partial rotary, parallel attention and MLP", "transformers"),
    Row("gemma", "MQA, GeGLU, scaled embeddings", "transformers"),
    Row("opt", "any model type not listed above", "refused"),
)


def row_config(row: Row, **extra):
    """The row's transformers config at the tiny size; ``extra`` (vocabulary, special token ids)
    is what a test's tokenizer needs and never changes the decision."""
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[row.model_type](**{**TINY[row.model_type], **row.overrides, **extra})


def serving_markdown_table() -> str:
    """The table as docs/architecture.md holds it, with ``serving_path``'s reason for each row."""
    lines = ["| model type | configuration | served by | why (`serving_path`) |", "| --- | --- | --- | --- |"]
    for row in ROWS:
        path = serving_path(row_config(row))
        reason = path.reason.replace("|", "\\|")
        lines.append(f"| `{row.model_type}` | {row.configuration} | {path.kind} | {reason} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(serving_markdown_table())
