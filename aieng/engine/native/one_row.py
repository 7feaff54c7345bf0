"""The batch-1 decode step in one call: ``aieng::one_row_layers`` (``kernels/one_row.cpp``).

A step of one decoding row and nothing else is the latency a single user feels, and it is bound
by how fast the weights stream. The projections already stream at the read bandwidth in aieng's
kernels; what the compiled graph adds around them (guards, its Python wrapper, an op per norm,
rotary, cache write and residual, each dispatched and allocated) costs a large share of a small
model's step, and more in the quantised formats, whose projections read fewer bytes. The fused
op runs every layer with plain loops between the same kernels, so such a step needs no compiled
graph at all. ``aieng bench engine`` reports the batch-1 step's split and its share of the read
bandwidth.

Used where it computes what ``llama.decoder_layer`` computes with the same kernels: aieng's CPU
kernels loaded (matvec and decode attention), float32 activations and norms, float32 biases,
and matrices every kernel takes. Anything else keeps the decoder layer's path.
"""

from __future__ import annotations

import torch

from aieng.engine.native.llama import Dims, LayerWeights


def fits(layers: list[LayerWeights], dims: Dims, dtype: torch.dtype) -> bool:
    """Whether ``one_row_layers`` computes these layers exactly as ``decoder_layer`` does."""
    if not (dims.matvec_kernel and dims.decode_kernel) or dtype != torch.float32:
        return False
    return all(_layer_fits(w) for w in layers)


def _layer_fits(w: LayerWeights) -> bool:
    float_parts = (w.norm_attn, w.norm_mlp, w.qkv_bias, w.o_bias, w.gate_up_bias, w.down_bias)
    if any(t is not None and t.dtype != torch.float32 for t in float_parts):
        return False
    for matrix in w.matrices:
        if matrix.dim() != 2 or not matrix.is_contiguous() or matrix.device.type != "cpu":
            return False
        width = matrix.shape[1] * (2 if matrix.dtype == torch.uint8 else 1)
        if width % (64 if matrix.dtype == torch.uint8 else 32):
            return False
        if matrix.dtype not in (torch.float32, torch.bfloat16, torch.int8, torch.uint8):
            return False
    return True


class OneRowStep:
    """The layers' tensors flattened once per weight copy (fp32, bf16, quantised), as the op takes
    them, and the call itself."""

    def __init__(self, dims: Dims):
        self.dims = dims
        self._flat: dict[int, tuple[list[LayerWeights], list]] = {}

    def hidden(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        position: int,
        slot: int,
        layers: list[LayerWeights],
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        """The row's hidden state [1, D] after every layer; writes its key and value in each
        layer's cache at (``slot``, ``position``)."""
        dims = self.dims
        return torch.ops.aieng.one_row_layers(
            x.float(),
            cos.reshape(-1),
            sin.reshape(-1),
            position,
            slot,
            self._tensors(layers),
            keys,
            values,
            dims.heads,
            dims.kv_heads,
            dims.head_dim,
            dims.eps,
        )

    def forget(self, layers: list[LayerWeights] | None) -> None:
        """Drop the flat list of a weight copy the model gives up, so its memory goes with it."""
        if layers is not None:
            self._flat.pop(id(layers), None)

    def _tensors(self, layers: list[LayerWeights]) -> list:
        kept = self._flat.get(id(layers))
        if kept is None or kept[0] is not layers:  # keyed by the list, kept alive beside its tensors
            kept = (layers, [t for w in layers for t in w.tensors()])
            self._flat[id(layers)] = kept
        return kept[1]
