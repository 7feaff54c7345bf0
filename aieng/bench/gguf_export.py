"""A Llama model folder in Hugging Face format -> one GGUF file that llama.cpp serves.

Used by ``aieng bench serve --peer llama.cpp``: the peer must run the *same* model, so this is a
conversion with proofs, not a best effort. What llama.cpp needs, and what is written:

- **Hyperparameters** under the ``llama.`` prefix (context, width, layers, heads, rope base, RMS eps).
- **Tensors** renamed to llama.cpp's names (``token_embd``, ``blk.N.attn_q``, ...). Tied embeddings
  write no ``output.weight``: llama.cpp then reuses ``token_embd`` for the output projection.
- **q and k permuted.** Hugging Face's Llama rotates the two *halves* of each head
  (``rotate_half``); llama.cpp's Llama rope rotates *adjacent pairs*. Reordering the rows of
  ``q_proj`` and ``k_proj`` within each head (half-split order -> interleaved order) makes the two
  compute the same attention scores. :func:`permute_qk` is that reordering, :func:`unpermute_qk`
  its inverse (the tests check the round trip against the safetensors).
- **The tokenizer**, byte-level BPE: the vocabulary in id order, the merges, a type per token
  (special tokens are CONTROL, so llama.cpp matches ``<|end|>`` in a prompt whole, as the HF
  tokenizer does), the pre-tokenizer by the name llama.cpp knows it under, the special ids, and
  ``add_bos_token = false`` (the chat template writes ``<|bos|>`` itself), plus the chat template.

Formats: ``f32`` (exact: greedy ids match the aieng engine's), ``bf16`` (2-D weights rounded to
bf16, as aieng's bf16 steps read them), ``q8_0`` and ``q4_0`` (2-D weights quantized in blocks of 32
by gguf's numpy quantizer); norms stay f32 in every format. None needs llama.cpp installed: only
the ``gguf`` package. ``cached_export`` keys a file by the model's file hashes, so a bench
re-uses it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

FORMATS = ("f32", "bf16", "q8_0", "q4_0")

#: Hugging Face tokenizers' pre-tokenizer, as a signature -> the ``tokenizer.ggml.pre`` name whose
#: regexes llama.cpp runs (src/llama-vocab.cpp): "starcoder" splits every digit (\p{N}) and then
#: applies GPT-2's regex, as Digits(individual_digits) + ByteLevel(use_regex) does.
PRE_TOKENIZERS = {(("Digits", True), ("ByteLevel", False, True)): "starcoder", (("ByteLevel", False, True),): "gpt-2"}

_LAYER_TENSORS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED, _TOKEN_UNUSED = 1, 3, 4, 5  # gguf.TokenType


class GGUFExportError(ValueError):
    """The folder is not something this exporter converts faithfully; the message says what."""


# ---------------------------------------------------------------------------------------------
# q/k permutation


def permute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of each head from half-split order (HF ``rotate_half``) to interleaved pairs (llama.cpp).

    Within a head of ``d`` rows, HF pairs row ``i`` with row ``i + d/2``; llama.cpp pairs rows
    ``2i`` and ``2i + 1``. Output row ``2i + j`` is input row ``j * d/2 + i``.
    """
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise GGUFExportError(f"{rows} rows do not split into {n_head} heads of an even size")
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of :func:`permute_qk` (interleaved pairs back to half-split order)."""
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# ---------------------------------------------------------------------------------------------
# reading the folder


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise GGUFExportError(f"{folder} has no config.json: not a Hugging Face model folder")
    config = json.loads(path.read_text())
    archs = config.get("architectures") or []
    if config.get("model_type") != "llama" or archs != ["LlamaForCausalLM"]:
        raise GGUFExportError(
            f"only Llama models convert to GGUF here (model_type 'llama', LlamaForCausalLM); "
            f"{folder} has model_type {config.get('model_type')!r}, architectures {archs}"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise GGUFExportError(f"{flag}=true is not supported by this exporter")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise GGUFExportError(f"rope_type {rope.get('rope_type')!r} is not supported (only 'default')")
    if config.get("hidden_act", "silu") != "silu":
        raise GGUFExportError(f"hidden_act {config.get('hidden_act')!r} is not supported (only 'silu')")
    return config


def read_weights(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors file(s) as float32 numpy (bf16/f16 widened)."""
    import torch
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise GGUFExportError(f"{folder} has no .safetensors file")
    weights = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                weights[name] = f.get_tensor(name).to(torch.float32).numpy()
    return weights


def read_tokenizer(folder: Path, vocab_size: int) -> dict:
    """tokens (by id), token types, merges, pre-tokenizer name, special ids, chat template."""
    tok_path = folder / "tokenizer.json"
    if not tok_path.is_file():
        raise GGUFExportError(f"{folder} has no tokenizer.json (a Hugging Face fast tokenizer is required)")
    tok = json.loads(tok_path.read_text())
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise GGUFExportError(f"tokenizer model {model.get('type')!r} is not supported (only byte-level BPE)")
    if tok.get("normalizer") is not None:
        raise GGUFExportError("a tokenizer with a normalizer is not supported")
    pre = _pre_tokenizer_name(tok.get("pre_tokenizer"))
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {a["id"]: a for a in tok.get("added_tokens") or []}
    for i, a in added.items():
        by_id[i] = a["content"]
    if max(by_id) >= vocab_size:
        raise GGUFExportError(f"token id {max(by_id)} is outside the model's vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(_TOKEN_UNUSED)  # an embedding row no text maps to
            continue
        tokens.append(by_id[i])
        types.append(
            _TOKEN_NORMAL if i not in added else _TOKEN_CONTROL if added[i].get("special") else _TOKEN_USER_DEFINED
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]

    cfg_path = folder / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    ids = {t: i for i, t in enumerate(tokens)}

    def special(role: str) -> int | None:
        value = tcfg.get(f"{role}_token")
        value = value.get("content") if isinstance(value, dict) else value
        return ids.get(value) if value is not None else None

    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "pre": pre,
        "bos": special("bos"),
        "eos": special("eos"),
        "pad": special("pad"),
        "unk": special("unk"),
        "chat_template": tcfg.get("chat_template"),
    }


def _pre_tokenizer_name(pre: dict | None) -> str:
    steps = (pre or {}).get("pretokenizers") if (pre or {}).get("type") == "Sequence" else [pre] if pre else []
    signature = []
    for step in steps:
        if step["type"] == "Digits":
            signature.append(("Digits", bool(step.get("individual_digits"))))
        elif step["type"] == "ByteLevel":
            signature.append(("ByteLevel", bool(step.get("add_prefix_space")), bool(step.get("use_regex", True))))
        else:
            signature.append((step["type"],))
    name = PRE_TOKENIZERS.get(tuple(signature))
    if name is None:
        raise GGUFExportError(
            f"pre-tokenizer {signature} has no llama.cpp equivalent known here "
            f"(known: {sorted(PRE_TOKENIZERS.values())})"
        )
    return name


# ---------------------------------------------------------------------------------------------
# writing


def gguf_tensor_name(hf_name: str) -> str | None:
    """llama.cpp's name for a Hugging Face Llama tensor; None for one that is not written."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf_name in fixed:
        return fixed[hf_name]
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        key = ".".join(parts[3:-1])
        if key in _LAYER_TENSORS:
            return f"blk.{parts[2]}.{_LAYER_TENSORS[key]}.weight"
    if hf_name.endswith("rotary_emb.inv_freq"):
        return None  # recomputed by llama.cpp from the rope base
    raise GGUFExportError(f"tensor {hf_name!r} has no llama.cpp Llama equivalent")


def export_gguf(folder: Path | str, out: Path | str, fmt: str = "f32", *, name: str | None = None) -> Path:
    """Write ``folder`` (HF Llama, safetensors, tokenizer.json) as a GGUF file at ``out``."""
    import gguf

    folder, out = Path(folder), Path(out)
    if fmt not in FORMATS:
        raise GGUFExportError(f"format {fmt!r} is not one of {FORMATS}")
    config = read_config(folder)
    vocab_size = config["vocab_size"]
    tok = read_tokenizer(folder, vocab_size)
    weights = read_weights(folder)
    n_head, n_kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    rope = config.get("rope_parameters") or {}
    tied = config.get("tie_word_embeddings", False) or "lm_head.weight" not in weights

    writer = gguf.GGUFWriter(None, "llama")
    writer.add_name(name or _model_name(folder))
    file_type, qtype = {
        "f32": (gguf.LlamaFileType.ALL_F32, None),
        "bf16": (gguf.LlamaFileType.MOSTLY_BF16, gguf.GGMLQuantizationType.BF16),
        "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, gguf.GGMLQuantizationType.Q8_0),
        "q4_0": (gguf.LlamaFileType.MOSTLY_Q4_0, gguf.GGMLQuantizationType.Q4_0),
    }[fmt]
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(vocab_size)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    writer.add_token_merges(tok["merges"])
    for role, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("pad", writer.add_pad_token_id),
        ("unk", writer.add_unk_token_id),
    ):
        if tok[role] is not None:
            add(tok[role])
    if tok["eos"] is not None:
        writer.add_eot_token_id(tok["eos"])  # the model ends a turn with EOS: the server stops on it
    writer.add_add_bos_token(False)  # the chat template writes <|bos|>; a second one would change the ids
    writer.add_add_eos_token(False)
    if tok["chat_template"]:
        writer.add_chat_template(tok["chat_template"])

    for hf_name in sorted(weights, key=_tensor_order):
        target = gguf_tensor_name(hf_name)
        if target is None or (target == "output.weight" and tied):
            continue
        data = weights[hf_name]
        if target.endswith("attn_q.weight"):
            data = permute_qk(data, n_head)
        elif target.endswith("attn_k.weight"):
            data = permute_qk(data, n_kv)
        data = np.ascontiguousarray(data, dtype=np.float32)
        if qtype is not None and data.ndim == 2 and data.shape[-1] % 32 == 0:
            writer.add_tensor(target, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(target, data)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)  # a half-written file is never taken for a finished one
    return out


def _tensor_order(name: str):
    parts = name.split(".")
    return (int(parts[2]), name) if parts[:2] == ["model", "layers"] else (-1 if "embed" in name else 10**9, name)


# ---------------------------------------------------------------------------------------------
# cache


def model_key(folder: Path) -> str:
    """A short hash of what the conversion reads: the manifest's file hashes when the folder is a
    store version (already verified), else the bytes of the files themselves."""
    folder = Path(folder)
    manifest = folder / "manifest.json"
    digest = hashlib.sha256()
    if manifest.is_file():
        digest.update(json.dumps(json.loads(manifest.read_text()).get("files", {}), sort_keys=True).encode())
    else:
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            digest.update(path.name.encode())
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:16]


def cached_export(folder: Path | str, cache_dir: Path | str, fmt: str = "f32") -> Path:
    """The GGUF of ``folder`` in ``cache_dir/<model key>/model-<fmt>.gguf``, converted once."""
    folder = Path(folder)
    out = Path(cache_dir) / model_key(folder) / f"model-{fmt}.gguf"
    if not out.is_file():
        export_gguf(folder, out, fmt)
    return out


def _model_name(folder: Path) -> str:
    manifest = folder / "manifest.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        if data.get("name"):
            return f"{data['name']}@{data.get('version')}"
    return folder.resolve().name
