"""The quantised weight formats by name (``int8``, ``int4``): what the model keeps a copy in and
which kernel multiplies it. A format's module says how it rounds (``quantize``, ``fits``); the
copy has the same ``LayerWeights`` shape as the float ones, its matrices in the format's storage
dtype with their scales beside them, so the forward takes any of them through ``linear``."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from aieng.engine.native import int4_weights, int8_weights
from aieng.engine.native.weight_rounding import layer_linears, rounded_linears

FORMATS = {"int8": int8_weights, "int4": int4_weights}


def fits_format(name: str, matrix: torch.Tensor) -> bool:
    return FORMATS[name].fits(matrix)


def quantize_matrix(name: str, matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(stored matrix, fp32 scales) of ``matrix`` in format ``name``."""
    return FORMATS[name].quantize(matrix)


def quantized_layer(weights, name: str):
    """``LayerWeights`` with its four matrices in format ``name`` and their scales beside them (norms
    and biases as they are)."""
    qkv, o, gate_up, down = (quantize_matrix(name, m) for m in weights.matrices)
    return replace(
        weights,
        qkv=qkv[0],
        o=o[0],
        gate_up=gate_up[0],
        down=down[0],
        qkv_scales=qkv[1],
        o_scales=o[1],
        gate_up_scales=gate_up[1],
        down_scales=down[1],
    )


def quantized_matvec(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 ``x @ weight.T`` for a quantised matrix, by its storage dtype: uint8 holds two 4-bit
    weights a byte (``aieng::matvec_int4``), int8 one (``aieng::matvec_int8``)."""
    if weight.dtype == torch.uint8:
        return torch.ops.aieng.matvec_int4(x, weight, scales)
    return torch.ops.aieng.matvec_int8(x, weight, scales)


def row_multiple(name: str) -> int:
    """Format ``name`` takes rows of a whole number of this many weights."""
    return FORMATS[name].ROW_MULTIPLE


@contextlib.contextmanager
def quantized_linears(model, name: str):
    """Run the decoder layers' Linear layers and the output projection as format ``name`` computes
    them: weights rounded by its ``quantize``, inputs by its ``round_input`` where it has one (int4),
    sums in fp32. For ``aieng eval --dtype int8|int4``: it grades exactly what serving in that
    format computes."""
    fmt = FORMATS[name]
    modules = [m for m in layer_linears(model) + [model.get_output_embeddings()] if fmt.fits(m.weight)]

    def round_weight(w: torch.Tensor) -> torch.Tensor:
        return fmt.dequantize(*fmt.quantize(w)).to(w.dtype)

    with rounded_linears(modules, round_weight, round_input=getattr(fmt, "round_input", None)):
        yield model


def format_of(weight: torch.Tensor) -> str:
    return "int4" if weight.dtype == torch.uint8 else "int8"
