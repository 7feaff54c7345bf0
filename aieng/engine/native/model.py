"""The weights of a transformers Llama-family model, arranged once for the serving forward
(``llama``): the layers' projections fused (q|k|v, gate|up) with every bias their modules carry,
an optional bf16 copy, an optional quantised copy (``quantized``: int8 or int4), oneDNN-packed copies where the
format plan uses them, the rotary table for the served context, and the compiled stack of decoder
layers.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from aieng.engine.compile_keys import key_kernels_by_torch_version
from aieng.engine.native import kernels, one_row, packed_weights
from aieng.engine.native.compile_marks import mark_step_dynamic, own_copy
from aieng.engine.native.llama import (
    AttentionPlan,
    Dims,
    LayerWeights,
    decoder_layer,
    few_rows,
    one_row_logits,
    rms_norm,
    run_layers,
)
from aieng.engine.native.quantized import fits_format, quantize_matrix, quantized_layer, quantized_matvec
from aieng.loading.device import compute_dtype
from aieng.model_facts import head_dim, kv_heads

log = logging.getLogger("aieng.engine")


class NativeLlama:
    """The weights of a transformers Llama-family model, arranged for ``decoder_layer``."""

    def __init__(
        self,
        model,
        *,
        bf16_copy: bool,
        compile_layers: bool,
        fp32_copy: bool = True,
        decode_kernel: bool = False,
        matvec_kernel: bool = False,
        packed_from: int = 0,
        packed_formats: frozenset[bool] = frozenset(),
        quantized_copy: str = "",
    ):
        """``packed_from``: multiply from oneDNN-packed copies of the layers' matrices in steps of
        at least that many tokens (``FormatPlan.packed_from``; 0: never); ``packed_formats``: the
        formats (bf16 or not) such steps run in, the only ones packed. ``quantized_copy``: keep the
        layers and the output projection in that quantised format too (``int8``, ``int4``; "": no
        copy), for steps of one row. ``fp32_copy``: for weights kept in bf16, whether some step runs
        in fp32 and needs the widened copy (``FormatPlan.uses_fp32``); ``bf16_copy`` is the same
        question for fp32 weights."""
        config, inner = model.config, model.model
        self.model = model
        stored = model.lm_head.weight
        self.dtype = compute_dtype(stored.dtype, stored.device)  # activations: fp32 on the CPU
        # A bf16 checkpoint the loader kept in bf16 (``device.choose_dtype``): its matrices are the
        # bf16 format as they are, shared with the transformers model, and fp32 ones are made only
        # when the plan runs some step size in fp32 (``fp32_copy``).
        self.kept_bf16 = stored.dtype == torch.bfloat16 and self.dtype != torch.bfloat16
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self._rotary_table: tuple[torch.Tensor, torch.Tensor] | None = None  # build_rotary_table
        self.final_norm = inner.norm.weight.detach().to(self.dtype)
        self.final_eps = getattr(inner.norm, "variance_epsilon", config.rms_norm_eps)
        stored_layers = [_layer_weights(layer).vectors_to(self.dtype) for layer in inner.layers]
        widen = stored.dtype != self.dtype and (fp32_copy or not self.kept_bf16)
        self.layers = [w.to(self.dtype) for w in stored_layers] if widen else stored_layers
        self.lm_head = stored.detach().to(self.dtype) if widen else stored
        self.dims = Dims(
            config.num_attention_heads,
            kv_heads(config),
            head_dim(config),
            config.rms_norm_eps,
            decode_kernel,
            packed_from,
            matvec_kernel,
        )
        # The output projection over the whole vocabulary is one more matrix a step streams: on a
        # model with a 150k-token vocabulary it is as large as a third of the layers, so it runs in
        # the step's format too (``logits``), not always in the model's.
        if self.kept_bf16:
            self.layers_bf16, self.lm_head_bf16 = stored_layers, (stored if widen else None)
        else:
            self.layers_bf16 = [w.to(torch.bfloat16) for w in self.layers] if bf16_copy else None
            self.lm_head_bf16 = (
                self.lm_head.to(torch.bfloat16) if bf16_copy and self.lm_head.dtype != torch.bfloat16 else None
            )
        self.layers_quantized = [quantized_layer(w, quantized_copy) for w in stored_layers] if quantized_copy else None
        self.lm_head_quantized = (
            quantize_matrix(quantized_copy, stored) if quantized_copy and fits_format(quantized_copy, stored) else None
        )
        for bf16 in packed_formats if packed_from else ():
            for w in self.weights(bf16):
                for matrix in w.matrices:
                    packed_weights.pack(matrix)
        # A step of one decoding row runs every layer in one call of aieng's kernels (``one_row``),
        # where they compute what ``decoder_layer`` does for each copy of the weights kept.
        copies = [c for c in (self.layers, self.layers_bf16, self.layers_quantized) if c is not None]
        self.one_row = (
            one_row.OneRowStep(self.dims) if all(one_row.fits(c, self.dims, self.dtype) for c in copies) else None
        )
        # Static by default (weights, hidden size); the step's row count and attention span, and the
        # cache's slot count and capacity, are marked dynamic (``mark_step_dynamic``,
        # ``mark_cache_dynamic``) so one graph serves every batch of 2+ rows.
        # size_asserts off: inductor's Python wrapper would check every buffer's size and stride on
        # every call (dozens per layer per step); the graph's inputs are already checked by dynamo's
        # guards and everything inside is inductor's own layout.
        if compile_layers:
            key_kernels_by_torch_version()  # a new venv with this torch reuses the cached kernels
        self.compiled_stack = (
            torch.compile(own_copy(run_layers), dynamic=None, options={"size_asserts": False})
            if compile_layers
            else None
        )
        # The one-row output projection, compiled (``one_row_logits``); usable once ``head_ready``
        # (``graphs.build_graphs`` builds it after the stack).
        self.compiled_head = (
            torch.compile(own_copy(one_row_logits), dynamic=False, options={"size_asserts": False})
            if compile_layers
            else None
        )
        self.head_ready = False

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def both_formats(self) -> bool:
        """fp32 and bf16 matrices are both kept, so a step may run in either."""
        return self.layers_bf16 is not None and self.layers_bf16 is not self.layers

    def layout(self) -> tuple:
        """Everything the compiled stack's guards check about the weights: two models with the same
        layout run the same graphs (weights are graph inputs, not constants)."""

        def of(layers):
            return None if layers is None else (tuple((t.shape, t.dtype) for t in layers[0].matrices), layers[0].biased)

        return self.dims, self.num_layers, self.dtype, of(self.layers), of(self.layers_bf16), of(self.layers_quantized)

    def share_graphs(self, other: NativeLlama) -> bool:
        """Use ``other``'s compiled stack when the layouts match: a hot swap to a version of the
        same architecture then warms up without tracing or compiling anything."""
        if self.compiled_stack is None or other.compiled_stack is None or self.layout() != other.layout():
            return False
        self.compiled_stack = other.compiled_stack
        self.compiled_head, self.head_ready = other.compiled_head, other.head_ready
        return True

    def weights(self, bf16: bool, quantized: bool = False) -> list[LayerWeights]:
        if quantized and self.layers_quantized is not None:
            return self.layers_quantized
        return self.layers_bf16 if bf16 and self.layers_bf16 is not None else self.layers

    def hidden(
        self,
        plan: AttentionPlan,
        cache,
        decode_tokens: torch.Tensor | None,
        prefill_tokens: torch.Tensor | None,
        prefill_positions: torch.Tensor | None,
        *,
        bf16: bool,
        compiled: bool,
        quantized: bool = False,
    ) -> torch.Tensor:
        """Run every layer over the decode tokens [B] (at ``plan.decode_pos``) and the prompt
        chunks' tokens [n, C] at rotary positions [n, C]; the final hidden states [B + n·C, D],
        decode rows first, then the chunks row by row."""
        xd = xp = cos_d = sin_d = cos_p = sin_p = None
        if decode_tokens is not None:
            xd = self.embed(decode_tokens).to(self.dtype)
            cos_d, sin_d = self.rotary_at(xd, plan.decode_pos)
        layers = self.weights(bf16, quantized)
        if self.one_row is not None and prefill_tokens is None and xd is not None and xd.shape[0] == 1:
            position = int(plan.decode_pos[0])
            return self.one_row.hidden(xd, cos_d, sin_d, position, plan.decode_first, layers, cache.keys, cache.values)
        if prefill_tokens is not None:
            xp = self.embed(prefill_tokens).to(self.dtype)
            n, chunk = prefill_tokens.shape
            cos_p, sin_p = (
                t.view(n, chunk, 1, -1) for t in self.rotary_at(xp.flatten(0, 1), prefill_positions.flatten())
            )
        rotary = (cos_d, sin_d, cos_p, sin_p)
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
        (the runner passes its cache capacity: no position it writes reaches it). Not for rotary
        types whose frequencies depend on the sequence's length (dynamic NTK,
        longrope): those keep computing per step."""
        if getattr(self.rotary, "rope_type", "default") in ("dynamic", "longrope"):
            return
        with torch.inference_mode():
            probe = torch.zeros(1, 1, dtype=self.dtype, device=self.lm_head.device)
            cos, sin = self.rotary(probe, torch.arange(positions, device=probe.device)[None])
        self._rotary_table = (cos[0, :, None, :].contiguous(), sin[0, :, None, :].contiguous())

    def drop_bf16_copy(self) -> None:
        """Give the bf16 copy's memory back (no step uses it), including the one-row step's view of it.
        Weights kept in bf16 are the model's own: nothing to give back."""
        if self.kept_bf16:
            return
        if self.one_row is not None:
            self.one_row.forget(self.layers_bf16)
        self.layers_bf16 = None
        self.lm_head_bf16 = None

    def head(self, bf16: bool) -> torch.Tensor:
        return self.lm_head_bf16 if bf16 and self.lm_head_bf16 is not None else self.lm_head

    def logits(
        self, hidden: torch.Tensor, *, bf16: bool = False, compiled: bool = False, quantized: bool = False
    ) -> torch.Tensor:
        """fp32 logits [N, vocab] of final hidden states [N, D]; ``bf16``: the projection reads the
        bf16 copy of the output matrix, when there is one (half the bytes of an fp32 model's);
        ``quantized``: a few rows read the quantised copy, when there is one; ``compiled``: one row goes
        through the compiled projection once it is built."""
        head, scales = self.head(bf16), None
        if quantized and self.lm_head_quantized is not None and hidden.shape[0] <= kernels.MATVEC_MAX_ROWS:
            head, scales = self.lm_head_quantized
        if compiled and self.head_ready and hidden.shape[0] == 1:
            try:
                return self.compiled_head(
                    hidden, self.final_norm, self.final_eps, head, self.dims.matvec_kernel, scales
                )
            except torch._dynamo.exc.TorchDynamoException as exc:  # includes inductor's errors
                log.warning(
                    "the compiled output projection failed (%s); continuing eagerly",
                    str(exc).splitlines()[0],
                    extra={"event": "engine_compile_fallback"},
                )
                self.head_ready = False
        normed = rms_norm(hidden, self.final_norm, self.final_eps)
        if scales is not None:
            return quantized_matvec(normed.float(), head, scales)
        if self.dims.matvec_kernel and few_rows(normed) and kernels.matvec_fits(head):
            return torch.ops.aieng.matvec(normed.float(), head)
        return F.linear(normed.to(head.dtype), head).float()

    def step_bytes(self, *, bf16: bool, quantized: bool = False) -> int:
        """Bytes of weights a one-row step reads: every layer's matrices (and quantised scales) and the
        output projection, in the format it runs in; the ceiling of a batch-1 step is memory
        bandwidth over this."""
        layers = sum(m.nbytes for w in self.weights(bf16, quantized) for m in w.matrices + w.scales)
        head = self.lm_head_quantized if quantized and self.lm_head_quantized is not None else (self.head(bf16),)
        return layers + sum(t.nbytes for t in head)


def fuse_layers(model) -> None:
    """Fuse every decoder layer's q/k/v and gate/up weights in place (``_fuse``). Run in the
    gunicorn master before fork, so each worker's ``NativeLlama`` finds them fused and shares those
    pages copy-on-write instead of concatenating a private copy of most of the layers' weights."""
    with torch.no_grad():  # as NativeLlama fuses: plain tensors, not inference ones
        for layer in model.model.layers:
            _layer_weights(layer)


def _fuse(modules, attribute: str) -> torch.Tensor | None:
    """Concatenate the modules' weights (or biases) and make the modules views of the result, so
    the transformers model keeps working (reference checks, evaluation) without a second copy.
    Modules that are already such views (``fuse_layers``, or the format plan's timing before the
    engine) give the fused tensor back as a view: fusing twice copies nothing."""
    tensors = [getattr(m, attribute) for m in modules]
    if tensors[0] is None:
        return None
    joined = _adjacent_views(tensors)
    if joined is not None:
        return joined
    fused = torch.cat([t.detach() for t in tensors]).contiguous()
    start = 0
    for module, t in zip(modules, tensors):
        setattr(module, attribute, torch.nn.Parameter(fused[start : start + t.shape[0]], requires_grad=False))
        start += t.shape[0]
    return fused


def _adjacent_views(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The tensors as one, when they lie back to back in one storage (contiguous, same dtype, each
    starting where the one before ends); otherwise None."""
    first = tensors[0]
    offset = first.storage_offset()
    for t in tensors:
        same_storage = t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        same_layout = t.dtype == first.dtype and t.shape[1:] == first.shape[1:] and t.is_contiguous()
        if not (same_storage and same_layout and t.storage_offset() == offset):
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return torch.as_strided(first.detach(), (rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _layer_weights(layer) -> LayerWeights:
    """The layer's weights and every bias its modules carry (None where a module has none)."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
    return LayerWeights(
        _fuse(qkv, "weight"),
        _fuse(qkv, "bias"),
        attn.o_proj.weight.detach(),
        _bias(attn.o_proj),
        _fuse(gate_up, "weight"),
        _fuse(gate_up, "bias"),
        mlp.down_proj.weight.detach(),
        _bias(mlp.down_proj),
        layer.input_layernorm.weight.detach(),
        layer.post_attention_layernorm.weight.detach(),
    )


def _bias(module) -> torch.Tensor | None:
    return None if module.bias is None else module.bias.detach()
