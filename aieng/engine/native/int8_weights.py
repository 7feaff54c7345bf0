"""The ``int8`` weight format: each matrix row cut into groups, each group stored as int8 with one
fp32 scale (symmetric: the group's largest magnitude maps to 127).

Why groups and not one scale per row: a single outlier weight sets its row's scale and crushes
the rest of the row to a few levels; a group of 32-128 weights keeps the error of most groups
small for a quarter of a scale's bytes per weight. It is the same trade llama.cpp's Q8_0 makes
(blocks of 32, fp16 scales). A one-row step reads each weight once, so a quarter of fp32's bytes
(half of bf16's) is what makes it faster; ``kernels/matvec.cpp`` multiplies the int8 weights
without widening them in memory, the input and the sums stay fp32.

Only steps of up to ``kernels.MATVEC_MAX_ROWS`` rows read them (the engine uses them for one-row
steps): with more rows a step is bound by arithmetic, not reads, and runs in the float formats.
``aieng eval --dtype int8`` grades exactly this rounding (``quantized.quantized_linears``).
"""

from __future__ import annotations

import torch

GROUP_SIZES = (128, 64, 32, 16)  # the largest that divides a row is used; 16 floats is the kernel's vector
ROW_MULTIPLE = GROUP_SIZES[-1]


def group_size(columns: int) -> int | None:
    """Weights per scale for rows of ``columns``; None when no group the kernel takes divides it."""
    return next((g for g in GROUP_SIZES if columns % g == 0), None)


def quantize(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], fp32 scales [N, K / group]) of a float matrix [N, K], rounded to nearest."""
    group = group_size(matrix.shape[1])
    if group is None:
        raise ValueError(f"int8 weights: a row of {matrix.shape[1]} weights is not a multiple of 16")
    grouped = matrix.detach().float().reshape(matrix.shape[0], -1, group)
    scales = grouped.abs().amax(-1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero group stays zero
    q = torch.round(grouped / safe[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.reshape(matrix.shape).contiguous(), scales.contiguous()


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 matrix the int8 weights stand for."""
    grouped = q.float().reshape(q.shape[0], scales.shape[1], -1)
    return (grouped * scales[..., None]).reshape(q.shape)


def fits(matrix: torch.Tensor) -> bool:
    return matrix.device.type == "cpu" and matrix.dim() == 2 and group_size(matrix.shape[1]) is not None
