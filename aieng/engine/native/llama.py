"""The Llama-family forward written for serving: static KV slots, mixed prefill/decode steps,
weights in the format each batch size runs fastest in, one compiled decoder layer.

transformers' ``LlamaForCausalLM.forward`` serves one shape of work: a batch of equal-length
rows and a cache it grows by concatenation. Serving needs more, so (like gpt-fast and vLLM) the
engine runs its own forward over the same weights:

- **One step, two groups of rows.** ``B`` decoding rows (one token each, in slots ``0..B-1``)
  and ``n`` rows being prefilled (a chunk of ``C`` prompt tokens each, right-padded). The linear
  layers, which are most of the work, run once on all ``B + n·C`` tokens; attention runs per
  group against the static cache (``slots.SlotKVCache``). So a long prompt joins in chunks while
  the running streams keep decoding in the same matrix multiplies.
- **Grouped-query attention without copies.** The query heads that share a key/value head are
  folded into the query-length dimension, so attention reads the cache views as they are (no
  ``repeat_kv``). On the CPU, decode rows use aieng's own kernel (``kernels``), which streams
  each row's keys and values once, split across the cores; prefill chunks use
  ``scaled_dot_product_attention``.
- **Weight formats by step size**: bf16 reads half the bytes, fp32 is faster arithmetic on CPUs
  without bf16 units, and which wins at which batch size depends on the machine; the runner
  keeps both copies when the plan uses both, and each step picks by its token count
  (``formats.FormatPlan``, measured at start-up). From the plan's ``packed_from`` tokens the
  matrices multiply from copies packed once in oneDNN's blocked layout (``packed_weights``).
- **Regional compilation, one call per step.** Every decoder layer has the same shapes, so the
  layer is a nested compile region (``torch.compiler.nested_compile_region``): inductor builds
  its kernels once and the compiled stack calls them for every layer. Compile time does not grow
  with depth, and a step crosses from Python into compiled code once, not once per layer (each
  ``torch.compile`` call pays for guards and wrappers, which per layer cost a large share of a
  batch-1 step). Decode-only steps use it; steps with a prefill chunk, which are compute-bound,
  run eagerly.

What it serves is decided by ``serving_path`` (llama, mistral and qwen2 configurations it is exact
for, checked against ``generate()`` row by row of ``serving_table``): every projection's bias as
the modules carry it, grouped- and multi-query attention, any head_dim, tied embeddings, and the
rotary cos/sin of the model's own rotary module. Anything else is served by the transformers
forward (``hf_runner``) or refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aieng.engine.native import packed_weights
from aieng.model_facts import head_dim, kv_heads
from aieng.engine.native.compile_marks import mark_step_dynamic, own_copy

@dataclass
class LayerWeights:
    """One decoder layer, projections fused: qkv [(H + 2·KV)·d, D] and gate|up [2·I, D]. Each
    projection's bias is None where its module has none (Llama's ``attention_bias`` biases all four
    attention projections, o included; ``mlp_bias`` all three MLP ones; Qwen2 biases q, k, v only)."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    norm_attn: torch.Tensor
    norm_mlp: torch.Tensor

    def to(self, dtype: torch.dtype) -> "LayerWeights":
        """A copy with the matrices in ``dtype`` (norms and biases stay as they are)."""
        return LayerWeights(self.qkv.to(dtype), self.qkv_bias, self.o.to(dtype), self.o_bias, self.gate_up.to(dtype),
                            self.gate_up_bias, self.down.to(dtype), self.down_bias, self.norm_attn, self.norm_mlp)

    def tensors(self) -> tuple:
        """Every field in order: the flat arguments of the compiled layer region."""
        return (self.qkv, self.qkv_bias, self.o, self.o_bias, self.gate_up, self.gate_up_bias, self.down,
                self.down_bias, self.norm_attn, self.norm_mlp)

    @property
    def matrices(self) -> tuple[torch.Tensor, ...]:
        return self.qkv, self.o, self.gate_up, self.down

    @property
    def biased(self) -> tuple[bool, ...]:
        return tuple(b is not None for b in (self.qkv_bias, self.o_bias, self.gate_up_bias, self.down_bias))


@dataclass(frozen=True)
class Dims:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    decode_kernel: bool = False  # decode attention by aieng's CPU kernel (``kernels``), else SDPA
    packed_from: int = 0  # from this many tokens matrices multiply from oneDNN-packed copies; 0: never


@dataclass
class AttentionPlan:
    """Where this step's tokens sit: ``B`` decode tokens first, then ``n`` chunks of ``C``.

    ``decode_pos`` [B]: each decoding row's position (= its cache length before the step).
    ``prefill_slots`` [n], ``prefill_pos`` [n, C]: slots and positions of the chunk tokens
    (padding is written to the scratch column and never attended by a real token).
    ``*_mask``: True where a query may attend a key, [B, 1, 1, Ld] and [n, 1, C, Lp].
    """

    decode_rows: int
    decode_first: int  # the first decoding slot in this call (0 unless an out-of-memory split)
    decode_pos: torch.Tensor | None
    decode_mask: torch.Tensor | None
    prefill_slots: torch.Tensor | None
    prefill_pos: torch.Tensor | None
    prefill_write: torch.Tensor | None
    prefill_mask: torch.Tensor | None


def run_layers(xd: torch.Tensor | None, xp: torch.Tensor | None, rotary: tuple, layers: list, dims: Dims,
               keys: list, values: list, plan: AttentionPlan) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Every decoder layer in turn: what ``NativeLlama`` compiles. The layer is called with flat
    arguments (tensors, ints, None) because only those let dynamo trace it once and stamp the
    trace out for the other layers; dataclass arguments make it re-trace every layer.

    The decode rows ``xd`` [B, D] and the prompt chunks ``xp`` [n, C, D] come in apart, so every
    size at the region's boundary is a plain symbol: one flat [B + n·C, D] input would make dynamo
    equate its size with B + n·C, and invoke_subgraph cannot stamp out a region whose input sizes
    are such sums."""
    # No Python int for the row count: it is read off decode_pos inside, so it stays the symbolic
    # size that ``mark_step_dynamic`` made it (an int would be a constant guarded per batch size).
    shared = (dims.heads, dims.kv_heads, dims.head_dim, dims.eps, dims.decode_kernel, dims.packed_from,
              plan.decode_first, plan.decode_pos, plan.decode_mask, plan.prefill_slots, plan.prefill_pos, plan.prefill_write, plan.prefill_mask)
    for i, w in enumerate(layers):
        out = _layer_region(xd, xp, *rotary, *w.tensors(), keys[i], values[i], *shared)
        xd, xp = (out[0] if xd is not None else None), (out[-1] if xp is not None else None)
    return xd, xp


def _flat_decoder_layer(xd, xp, cos_d, sin_d, cos_p, sin_p, qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down,
                        down_bias, norm_attn, norm_mlp, keys, values, heads, kv_heads, head_dim, eps, decode_kernel,
                        packed_from, decode_first, decode_pos, *rest):
    rows = 0 if decode_pos is None else decode_pos.shape[0]
    out = decoder_layer(xd, xp, (cos_d, sin_d, cos_p, sin_p),
                        LayerWeights(qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down, down_bias, norm_attn,
                                     norm_mlp),
                        Dims(heads, kv_heads, head_dim, eps, decode_kernel, packed_from), keys, values,
                        AttentionPlan(rows, decode_first, decode_pos, *rest))
    return tuple(t for t in out if t is not None)  # tensors only: a None output makes the region unreusable


def causal_decode_mask(decode_pos: torch.Tensor, span: int) -> torch.Tensor:
    """[B, 1, 1, span] True where a decoding row at ``decode_pos`` may attend (keys 0..its position)."""
    return (torch.arange(span, device=decode_pos.device)[None, :] <= decode_pos[:, None])[:, None, None, :]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed_from: int = 0) -> torch.Tensor:
    """``x @ weight.T`` in the weight's dtype, result in ``x``'s (fp32 activations throughout).

    One row inside a compiled graph goes through ``streamed_matvec`` instead of the BLAS kernel;
    with ``packed_from``, the weights go through ``packed_weights.packed_linear``, which uses
    their oneDNN-packed copy from that many rows (it decides per call, so the graph is one)."""
    if x.shape[0] == 1 and torch.compiler.is_compiling():
        out = streamed_matvec(x, weight)
    elif packed_from:
        out = torch.ops.aieng.packed_linear(x.to(weight.dtype), weight, packed_from).to(x.dtype)
    else:
        out = F.linear(x.to(weight.dtype), weight).to(x.dtype)
    return out if bias is None else out + bias


def streamed_matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for one row [1, K], written for inductor to generate the kernel.

    A one-row product reads every weight once for two flops each: memory speed is all that
    counts. As a multiply-and-sum, inductor emits a vectorised reduction that streams the weight
    and widens bf16 to fp32 as it loads (the input is not rounded to bf16). Split into equal
    blocks of output rows, the blocks' reductions are fused into one loop with one accumulator
    each, so several rows stream at once instead of one add chain waiting on the last: on the
    realistic shape at batch 1, one block loses to BLAS ``F.linear``, eight blocks beat it, and
    eight blocks of bf16 weights (half the bytes) beat it by more. The runner times this graph in
    both formats when it builds it (``formats``)."""
    rows = weight.shape[0]
    blocks = next(b for b in (8, 4, 2, 1) if rows % b == 0)
    size = rows // blocks
    parts = [(x[:, None, :] * weight[i * size:(i + 1) * size].to(x.dtype)).sum(-1) for i in range(blocks)]
    return parts[0] if blocks == 1 else torch.cat(parts, dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [N, heads, d] with cos/sin [N, 1, d] (the rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def decoder_layer(xd: torch.Tensor | None, xp: torch.Tensor | None, rotary: tuple, w: LayerWeights, dims: Dims,
                  keys: torch.Tensor, values: torch.Tensor, plan: AttentionPlan):
    """One decoder layer over the step's decode rows ``xd`` [B, D] and prompt chunks ``xp``
    [n, C, D] (either may be None); ``rotary`` is their cos/sin, (cos_d, sin_d) [B, 1, d] and
    (cos_p, sin_p) [n, C, 1, d]. The projections run once over all B + n·C tokens; attention runs
    per group. Writes this layer's cache in place."""
    cos_d, sin_d, cos_p, sin_p = rotary
    b = plan.decode_rows
    flat = [t for t in (xd, None if xp is None else xp.flatten(0, 1)) if t is not None]
    x = flat[0] if len(flat) == 1 else torch.cat(flat)
    n_tokens = x.shape[0]
    h = rms_norm(x, w.norm_attn, dims.eps)
    qkv = linear(h, w.qkv, w.qkv_bias, dims.packed_from)
    q_size, kv_size = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    q = qkv[:, :q_size].view(n_tokens, dims.heads, dims.head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(n_tokens, dims.kv_heads, dims.head_dim)
    v = qkv[:, q_size + kv_size:].view(n_tokens, dims.kv_heads, dims.head_dim)
    groups = dims.heads // dims.kv_heads
    # Every cache write of the step before any read: the compiled graph then updates the cache in
    # place. (A custom op reading the cache between two writes made inductor copy the whole cache
    # per layer, every step.)
    if b:
        first = plan.decode_first
        rows = torch.arange(first, first + b, device=x.device)
        keys[rows, :, plan.decode_pos] = rotate(k[:b], cos_d, sin_d).to(keys.dtype)
        values[rows, :, plan.decode_pos] = v[:b].to(values.dtype)
    if xp is not None:
        n, chunk = xp.shape[0], xp.shape[1]
        slots = plan.prefill_slots[:, None]
        keys[slots, :, plan.prefill_write] = rotate(k[b:].view(n, chunk, dims.kv_heads, dims.head_dim), cos_p,
                                                    sin_p).to(keys.dtype)
        values[slots, :, plan.prefill_write] = v[b:].view(n, chunk, dims.kv_heads, dims.head_dim).to(values.dtype)
    parts = []
    if b:
        query = rotate(q[:b], cos_d, sin_d).view(b, dims.kv_heads, groups, dims.head_dim)  # a KV head's query heads as rows
        if dims.decode_kernel:  # reads each row's keys 0..position straight from its slot
            out = torch.ops.aieng.decode_attention(query, keys, values, plan.decode_pos, first, dims.head_dim ** -0.5)
        else:
            length = plan.decode_mask.shape[-1]
            out = F.scaled_dot_product_attention(query, keys[first:first + b, :, :length].to(query.dtype),
                                                 values[first:first + b, :, :length].to(query.dtype),
                                                 attn_mask=plan.decode_mask)
        parts.append(out.reshape(b, q_size))
    if xp is not None:
        length = plan.prefill_mask.shape[-1]
        query = (rotate(q[b:].view(n, chunk, dims.heads, dims.head_dim), cos_p, sin_p)
                 .view(n, chunk, dims.kv_heads, groups, dims.head_dim)
                 .permute(0, 2, 3, 1, 4).reshape(n, dims.kv_heads, groups * chunk, dims.head_dim))
        mask = plan.prefill_mask.repeat(1, 1, groups, 1)
        cached_k = keys[:, :, :length].index_select(0, plan.prefill_slots).to(query.dtype)  # a bf16 cache widened
        cached_v = values[:, :, :length].index_select(0, plan.prefill_slots).to(query.dtype)
        out = F.scaled_dot_product_attention(query, cached_k, cached_v, attn_mask=mask)  # [n, KV, g·C, d]
        out = out.view(n, dims.kv_heads, groups, chunk, dims.head_dim).permute(0, 3, 1, 2, 4)
        parts.append(out.reshape(n * chunk, q_size))
    attn = parts[0] if len(parts) == 1 else torch.cat(parts)
    x = x + linear(attn, w.o, w.o_bias, dims.packed_from)
    h = rms_norm(x, w.norm_mlp, dims.eps)
    gate, up = linear(h, w.gate_up, w.gate_up_bias, dims.packed_from).chunk(2, dim=-1)
    mlp = linear(F.silu(gate) * up, w.down, w.down_bias, dims.packed_from)
    # Two sums, not one split afterwards: the region's outputs must not alias each other.
    return (x[:b] + mlp[:b] if b else None), ((x[b:] + mlp[b:]).view(xp.shape) if xp is not None else None)


# The layer as a region compiled once and reused by every layer of the compiled stack (eagerly,
# outside torch.compile, it is just the function).
_layer_region = torch.compiler.nested_compile_region(_flat_decoder_layer, max_reuse_entries=32)


class NativeLlama:
    """The weights of a transformers Llama-family model, arranged for ``decoder_layer``."""

    def __init__(self, model, *, bf16_copy: bool, compile_layers: bool, decode_kernel: bool = False,
                 packed_from: int = 0, packed_formats: frozenset[bool] = frozenset()):
        """``packed_from``: multiply from oneDNN-packed copies of the layers' matrices in steps of
        at least that many tokens (``FormatPlan.packed_from``; 0: never); ``packed_formats``: the
        formats (bf16 or not) such steps run in, the only ones packed."""
        config, inner = model.config, model.model
        self.model = model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self._rotary_table: tuple[torch.Tensor, torch.Tensor] | None = None  # build_rotary_table
        self.final_norm = inner.norm.weight
        self.final_eps = getattr(inner.norm, "variance_epsilon", config.rms_norm_eps)
        self.lm_head = model.lm_head.weight
        self.layers = [_layer_weights(layer) for layer in inner.layers]
        self.dims = Dims(config.num_attention_heads, kv_heads(config), head_dim(config), config.rms_norm_eps,
                         decode_kernel, packed_from)
        self.layers_bf16 = [w.to(torch.bfloat16) for w in self.layers] if bf16_copy else None
        for bf16 in packed_formats if packed_from else ():
            for w in self.weights(bf16):
                for matrix in w.matrices:
                    packed_weights.pack(matrix)
        self.dtype = self.lm_head.dtype
        # Static by default (weights, hidden size); the step's row count and attention span, and the
        # cache's slot count and capacity, are marked dynamic (``mark_step_dynamic``,
        # ``mark_cache_dynamic``) so one graph serves every batch of 2+ rows.
        # size_asserts off: inductor's Python wrapper would check every buffer's size and stride on
        # every call (dozens per layer per step); the graph's inputs are already checked by dynamo's
        # guards and everything inside is inductor's own layout.
        self.compiled_stack = (torch.compile(own_copy(run_layers), dynamic=None, options={"size_asserts": False})
                               if compile_layers else None)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layout(self) -> tuple:
        """Everything the compiled stack's guards check about the weights: two models with the same
        layout run the same graphs (weights are graph inputs, not constants)."""
        def of(layers):
            return None if layers is None else (tuple((t.shape, t.dtype) for t in layers[0].matrices), layers[0].biased)
        return self.dims, self.num_layers, self.dtype, of(self.layers), of(self.layers_bf16)

    def share_graphs(self, other: "NativeLlama") -> bool:
        """Use ``other``'s compiled stack when the layouts match: a hot swap to a version of the
        same architecture then warms up without tracing or compiling anything."""
        if self.compiled_stack is None or other.compiled_stack is None or self.layout() != other.layout():
            return False
        self.compiled_stack = other.compiled_stack
        return True

    def weights(self, bf16: bool) -> list[LayerWeights]:
        return self.layers_bf16 if bf16 and self.layers_bf16 is not None else self.layers

    def hidden(self, plan: AttentionPlan, cache, decode_tokens: torch.Tensor | None,
               prefill_tokens: torch.Tensor | None, prefill_positions: torch.Tensor | None, *,
               bf16: bool, compiled: bool) -> torch.Tensor:
        """Run every layer over the decode tokens [B] (at ``plan.decode_pos``) and the prompt
        chunks' tokens [n, C] at rotary positions [n, C]; the final hidden states [B + n·C, D],
        decode rows first, then the chunks row by row."""
        xd = xp = cos_d = sin_d = cos_p = sin_p = None
        if decode_tokens is not None:
            xd = self.embed(decode_tokens)
            cos_d, sin_d = self.rotary_at(xd, plan.decode_pos)
        if prefill_tokens is not None:
            xp = self.embed(prefill_tokens)
            n, chunk = prefill_tokens.shape
            cos_p, sin_p = (t.view(n, chunk, 1, -1) for t in self.rotary_at(xp.flatten(0, 1), prefill_positions.flatten()))
        rotary = (cos_d, sin_d, cos_p, sin_p)
        layers = self.weights(bf16)
        if compiled and self.compiled_stack is not None:
            mark_step_dynamic(xd, xp, rotary, plan)
            xd, xp = self.compiled_stack(xd, xp, rotary, layers, self.dims, cache.keys, cache.values, plan)
        else:
            for i, w in enumerate(layers):
                xd, xp = decoder_layer(xd, xp, rotary, w, self.dims, cache.keys[i], cache.values[i], plan)
        if xp is None:
            return xd
        return xp.flatten(0, 1) if xd is None else torch.cat([xd, xp.flatten(0, 1)])

    def rotary_at(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [N, 1, d] at ``positions``: rows of the table when there is one, else the
        model's rotary module (whose forward costs a few kernels per step: a large share of a
        small model's step)."""
        if self._rotary_table is not None:
            return self._rotary_table[0][positions], self._rotary_table[1][positions]
        cos, sin = self.rotary(x[None], positions[None])
        return cos[0, :, None, :], sin[0, :, None, :]

    def build_rotary_table(self, positions: int) -> None:
        """Precompute cos/sin for positions ``0..positions-1`` with the model's own rotary module
        (the runner passes its cache capacity: no position it writes reaches it). Not for rotary types whose frequencies depend on the sequence's length (dynamic NTK,
        longrope): those keep computing per step."""
        if getattr(self.rotary, "rope_type", "default") in ("dynamic", "longrope"):
            return
        with torch.inference_mode():
            probe = torch.zeros(1, 1, dtype=self.dtype, device=self.lm_head.device)
            cos, sin = self.rotary(probe, torch.arange(positions, device=probe.device)[None])
        self._rotary_table = (cos[0, :, None, :].contiguous(), sin[0, :, None, :].contiguous())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(hidden, self.final_norm, self.final_eps), self.lm_head).float()


def _fuse(modules, attribute: str) -> torch.Tensor | None:
    """Concatenate the modules' weights (or biases) and make the modules views of the result, so
    the transformers model keeps working (reference checks, evaluation) without a second copy."""
    tensors = [getattr(m, attribute) for m in modules]
    if tensors[0] is None:
        return None
    fused = torch.cat([t.detach() for t in tensors]).contiguous()
    start = 0
    for module, t in zip(modules, tensors):
        setattr(module, attribute, torch.nn.Parameter(fused[start:start + t.shape[0]], requires_grad=False))
        start += t.shape[0]
    return fused


def _layer_weights(layer) -> LayerWeights:
    """The layer's weights and every bias its modules carry (None where a module has none)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
    return LayerWeights(_fuse(qkv, "weight"), _fuse(qkv, "bias"), attn.o_proj.weight.detach(), _bias(attn.o_proj),
                        _fuse(gate_up, "weight"), _fuse(gate_up, "bias"), mlp.down_proj.weight.detach(),
                        _bias(mlp.down_proj), layer.input_layernorm.weight.detach(),
                        layer.post_attention_layernorm.weight.detach())


def _bias(module) -> torch.Tensor | None:
    return None if module.bias is None else module.bias.detach()
