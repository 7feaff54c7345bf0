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
  batch-1 step). Decode steps of 2+ rows use it; steps with a prefill chunk, which are
  compute-bound, run eagerly; a step of one decoding row runs every layer in one call of aieng's
  kernels instead (``one_row``), where what a graph adds per layer is most of what is left.

What it serves is decided by ``serving_path`` (llama, mistral and qwen2 configurations it is exact
for, checked against ``generate()`` row by row of ``serving_table``): every projection's bias as
the modules carry it, grouped- and multi-query attention, any head_dim, tied embeddings, and the
rotary cos/sin of the model's own rotary module. Anything else is served by the transformers
forward (``hf_runner``) or refused.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F

from aieng.engine.native import kernels
from aieng.engine.native.quantized import quantized_matvec


@dataclass
class LayerWeights:
    """One decoder layer, projections fused: qkv [(H + 2·KV)·d, D] and gate|up [2·I, D]. Each
    projection's bias is None where its module has none (Llama's ``attention_bias`` biases all four
    attention projections, o included; ``mlp_bias`` all three MLP ones; Qwen2 biases q, k, v only).
    In a quantised format (``quantized``) the matrices are stored in its dtype and each has its
    scales; else the scales are None."""

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
    qkv_scales: torch.Tensor | None = None
    o_scales: torch.Tensor | None = None
    gate_up_scales: torch.Tensor | None = None
    down_scales: torch.Tensor | None = None

    def to(self, dtype: torch.dtype) -> LayerWeights:
        """A copy with the matrices in ``dtype`` (norms and biases stay as they are)."""
        return replace(
            self, qkv=self.qkv.to(dtype), o=self.o.to(dtype), gate_up=self.gate_up.to(dtype), down=self.down.to(dtype)
        )

    def vectors_to(self, dtype: torch.dtype) -> LayerWeights:
        """The norms and biases in ``dtype`` (the activations' dtype), the matrices as they are."""

        def cast(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(dtype)

        return replace(
            self,
            qkv_bias=cast(self.qkv_bias),
            o_bias=cast(self.o_bias),
            gate_up_bias=cast(self.gate_up_bias),
            down_bias=cast(self.down_bias),
            norm_attn=cast(self.norm_attn),
            norm_mlp=cast(self.norm_mlp),
        )

    def tensors(self) -> tuple:
        """Every field in order: the flat arguments of the compiled layer region."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @property
    def matrices(self) -> tuple[torch.Tensor, ...]:
        return self.qkv, self.o, self.gate_up, self.down

    @property
    def scales(self) -> tuple[torch.Tensor, ...]:
        """The quantised matrices' scales, in the order of ``matrices`` (none in a float format)."""
        return tuple(
            s for s in (self.qkv_scales, self.o_scales, self.gate_up_scales, self.down_scales) if s is not None
        )

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
    matvec_kernel: bool = False  # steps of a few rows multiply by aieng's CPU kernel (``kernels``)


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


def run_layers(
    xd: torch.Tensor | None,
    xp: torch.Tensor | None,
    rotary: tuple,
    layers: list,
    dims: Dims,
    keys: list,
    values: list,
    plan: AttentionPlan,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Every decoder layer in turn: what ``NativeLlama`` compiles. The layer is called with flat
    arguments (tensors, ints, None) because only those let dynamo trace it once and stamp the
    trace out for the other layers; dataclass arguments make it re-trace every layer.

    The decode rows ``xd`` [B, D] and the prompt chunks ``xp`` [n, C, D] come in apart, so every
    size at the region's boundary is a plain symbol: one flat [B + n·C, D] input would make dynamo
    equate its size with B + n·C, and invoke_subgraph cannot stamp out a region whose input sizes
    are such sums."""
    # No Python int for the row count: it is read off decode_pos inside, so it stays the symbolic
    # size that ``mark_step_dynamic`` made it (an int would be a constant guarded per batch size).
    shared = (
        dims.heads,
        dims.kv_heads,
        dims.head_dim,
        dims.eps,
        dims.decode_kernel,
        dims.packed_from,
        dims.matvec_kernel,
        plan.decode_first,
        plan.decode_pos,
        plan.decode_mask,
        plan.prefill_slots,
        plan.prefill_pos,
        plan.prefill_write,
        plan.prefill_mask,
    )
    for i, w in enumerate(layers):
        out = _layer_region(xd, xp, *rotary, *w.tensors(), keys[i], values[i], *shared)
        xd, xp = (out[0] if xd is not None else None), (out[-1] if xp is not None else None)
    return xd, xp


_LAYER_FIELDS, _DIMS_FIELDS = len(fields(LayerWeights)), len(fields(Dims))  # constants for the trace


def _flat_decoder_layer(xd, xp, cos_d, sin_d, cos_p, sin_p, *rest):
    """``decoder_layer`` on ``run_layers``' flat arguments: the layer's tensors (``LayerWeights``'
    fields in order), its keys and values, ``Dims``' fields, then the plan's."""
    n, d = _LAYER_FIELDS, _DIMS_FIELDS
    w, (keys, values), dims = LayerWeights(*rest[:n]), rest[n : n + 2], Dims(*rest[n + 2 : n + 2 + d])
    decode_first, decode_pos = rest[n + 2 + d : n + 4 + d]
    rows = 0 if decode_pos is None else decode_pos.shape[0]
    out = decoder_layer(
        xd,
        xp,
        (cos_d, sin_d, cos_p, sin_p),
        w,
        dims,
        keys,
        values,
        AttentionPlan(rows, decode_first, decode_pos, *rest[n + 4 + d :]),
    )
    return tuple(t for t in out if t is not None)  # tensors only: a None output makes the region unreusable


def causal_decode_mask(decode_pos: torch.Tensor, span: int) -> torch.Tensor:
    """[B, 1, 1, span] True where a decoding row at ``decode_pos`` may attend (keys 0..its position)."""
    return (torch.arange(span, device=decode_pos.device)[None, :] <= decode_pos[:, None])[:, None, None, :]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dims: Dims, scales: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T`` in the weight's dtype, result in ``x``'s (fp32 activations throughout).

    Quantised weights come with their ``scales`` and always go through their kernel
    (``quantized_matvec``; the runner gives them only to steps of a few rows).

    With aieng's kernels, the product is ``aieng::matvec``: a few rows, bound by how fast the
    weights stream, run in its kernel and more rows in ``at::linear`` (it decides per call, so a
    compiled graph whose row count varies is one). Without them, one row inside a compiled graph
    goes through ``streamed_matvec`` instead of the BLAS kernel. With ``packed_from``, the weights
    go through ``packed_weights.packed_linear``, which uses their oneDNN-packed copy from that many
    rows (also per call), and only the rows ``few_rows`` sees at trace time through the kernel."""
    packed_from = dims.packed_from
    if scales is not None:
        out = quantized_matvec(x.float(), weight, scales).to(x.dtype)
    elif dims.matvec_kernel and kernels.matvec_fits(weight) and (not packed_from or few_rows(x)):
        out = torch.ops.aieng.matvec(x.float(), weight).to(x.dtype)
    elif x.shape[0] == 1 and torch.compiler.is_dynamo_compiling():
        out = streamed_matvec(x, weight)
    elif packed_from:
        out = torch.ops.aieng.packed_linear(x.to(weight.dtype), weight, packed_from).to(x.dtype)
    else:
        out = F.linear(x.to(weight.dtype), weight).to(x.dtype)
    return out if bias is None else out + bias


def few_rows(x: torch.Tensor) -> bool:
    """One row, or (outside a compiled graph) up to ``kernels.MATVEC_MAX_ROWS``. A compiled graph
    of two or more rows has a symbolic row count, and asking whether it is small would make dynamo
    guard on it and compile a graph per batch size, so there only the static one-row graph asks.
    Asked with ``is_dynamo_compiling``, true only inside the trace: ``is_compiling`` is one flag for
    the whole process, up while the graphs compile in the background, when eager steps on the
    engine thread would read it too and leave their kernels."""
    rows = x.shape[0]
    return rows == 1 or (not torch.compiler.is_dynamo_compiling() and rows <= kernels.MATVEC_MAX_ROWS)


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
    parts = [(x[:, None, :] * weight[i * size : (i + 1) * size].to(x.dtype)).sum(-1) for i in range(blocks)]
    return parts[0] if blocks == 1 else torch.cat(parts, dim=-1)


def one_row_logits(
    hidden: torch.Tensor,
    norm: torch.Tensor,
    eps: float,
    head: torch.Tensor,
    matvec_kernel: bool = False,
    head_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 logits [1, vocab] of one final hidden state [1, D], for inductor to compile: the output
    projection over the whole vocabulary is the largest single matrix a one-row step reads (a third
    of the layers' bytes on a 150k-token vocabulary), so it streams through aieng's kernel (or,
    without it, ``streamed_matvec``), not the BLAS kernel built for matrices."""
    normed = rms_norm(hidden, norm, eps)
    if head_scales is not None:
        return quantized_matvec(normed.float(), head, head_scales)
    if matvec_kernel and kernels.matvec_fits(head):
        return torch.ops.aieng.matvec(normed.float(), head)
    return streamed_matvec(normed, head)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on [N, heads, d] with cos/sin [N, 1, d] (the rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def decoder_layer(
    xd: torch.Tensor | None,
    xp: torch.Tensor | None,
    rotary: tuple,
    w: LayerWeights,
    dims: Dims,
    keys: torch.Tensor,
    values: torch.Tensor,
    plan: AttentionPlan,
):
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
    qkv = linear(h, w.qkv, w.qkv_bias, dims, w.qkv_scales)
    q_size, kv_size = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    q = qkv[:, :q_size].view(n_tokens, dims.heads, dims.head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(n_tokens, dims.kv_heads, dims.head_dim)
    v = qkv[:, q_size + kv_size :].view(n_tokens, dims.kv_heads, dims.head_dim)
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
        keys[slots, :, plan.prefill_write] = rotate(
            k[b:].view(n, chunk, dims.kv_heads, dims.head_dim), cos_p, sin_p
        ).to(keys.dtype)
        values[slots, :, plan.prefill_write] = v[b:].view(n, chunk, dims.kv_heads, dims.head_dim).to(values.dtype)
    parts = []
    if b:
        query = rotate(q[:b], cos_d, sin_d).view(
            b, dims.kv_heads, groups, dims.head_dim
        )  # a KV head's query heads as rows
        if dims.decode_kernel:  # reads each row's keys 0..position straight from its slot
            out = torch.ops.aieng.decode_attention(query, keys, values, plan.decode_pos, first, dims.head_dim**-0.5)
        else:
            length = plan.decode_mask.shape[-1]
            out = F.scaled_dot_product_attention(
                query,
                keys[first : first + b, :, :length].to(query.dtype),
                values[first : first + b, :, :length].to(query.dtype),
                attn_mask=plan.decode_mask,
            )
        parts.append(out.reshape(b, q_size))
    if xp is not None:
        length = plan.prefill_mask.shape[-1]
        query = (
            rotate(q[b:].view(n, chunk, dims.heads, dims.head_dim), cos_p, sin_p)
            .view(n, chunk, dims.kv_heads, groups, dims.head_dim)
            .permute(0, 2, 3, 1, 4)
            .reshape(n, dims.kv_heads, groups * chunk, dims.head_dim)
        )
        mask = plan.prefill_mask.repeat(1, 1, groups, 1)
        cached_k = keys[:, :, :length].index_select(0, plan.prefill_slots).to(query.dtype)  # a bf16 cache widened
        cached_v = values[:, :, :length].index_select(0, plan.prefill_slots).to(query.dtype)
        out = F.scaled_dot_product_attention(query, cached_k, cached_v, attn_mask=mask)  # [n, KV, g·C, d]
        out = out.view(n, dims.kv_heads, groups, chunk, dims.head_dim).permute(0, 3, 1, 2, 4)
        parts.append(out.reshape(n * chunk, q_size))
    attn = parts[0] if len(parts) == 1 else torch.cat(parts)
    x = x + linear(attn, w.o, w.o_bias, dims, w.o_scales)
    h = rms_norm(x, w.norm_mlp, dims.eps)
    gate, up = linear(h, w.gate_up, w.gate_up_bias, dims, w.gate_up_scales).chunk(2, dim=-1)
    mlp = linear(F.silu(gate) * up, w.down, w.down_bias, dims, w.down_scales)
    # Two sums, not one split afterwards: the region's outputs must not alias each other.
    return (x[:b] + mlp[:b] if b else None), ((x[b:] + mlp[b:]).view(xp.shape) if xp is not None else None)


# The layer as a region compiled once and reused by every layer of the compiled stack (eagerly,
# outside torch.compile, it is just the function).
_layer_region = torch.compiler.nested_compile_region(_flat_decoder_layer, max_reuse_entries=32)
