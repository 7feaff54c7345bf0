"""The ``int4`` weight format: each matrix row cut into groups of 32 weights, each stored as 4-bit
integers in [-8, 7] with one fp32 scale (the group's largest magnitude maps to -8, so all sixteen
levels are used: the rounding llama.cpp's Q4_0 makes), two weights a byte.

Why it is a separate format and not a smaller int8: a quarter of bf16's bytes is what makes a
one-row step faster, but widening every nibble to fp32 before multiplying costs more instructions
than the memory saves on two cores. So ``aieng::matvec_int4`` rounds the step's *input* too, each
group of 32 values to int8 with its own scale, and multiplies integers (``kernels/matvec.cpp``).
Both roundings cost accuracy, which is why the format is the operator's choice
(``AIENG_WEIGHT_FORMATS=int4``), never ``auto``'s; ``aieng eval --dtype int4`` grades exactly the
arithmetic the kernel does (``quantized.quantized_linears``).

Byte layout (what the kernel unpacks 64 weights at a time): row ``K`` weights are ``K / 64``
chunks of 32 bytes; byte ``j`` of a chunk holds weight ``j`` of the chunk in its low nibble and
weight ``32 + j`` in its high one, each as ``q + 8``.
"""

from __future__ import annotations

import torch

GROUP = 32  # weights per scale
CHUNK = 64  # weights per 32 bytes: a row is a whole number of them
ROW_MULTIPLE = CHUNK


def fits(matrix: torch.Tensor) -> bool:
    return matrix.device.type == "cpu" and matrix.dim() == 2 and matrix.shape[1] % CHUNK == 0


def quantize(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 [N, K / 2], fp32 scales [N, K / 32]) of a float matrix [N, K]."""
    rows, columns = matrix.shape
    if columns % CHUNK:
        raise ValueError(f"int4 weights: a row of {columns} weights is not a multiple of {CHUNK}")
    grouped = matrix.detach().float().reshape(rows, columns // GROUP, GROUP)
    extreme = grouped.gather(-1, grouped.abs().argmax(-1, keepdim=True)).squeeze(-1)
    scales = extreme / -8.0
    safe = torch.where(scales != 0, scales, torch.ones_like(scales))  # an all-zero group stays zero
    q = torch.round(grouped / safe[..., None]).clamp_(-8, 7) + 8
    halves = q.to(torch.uint8).reshape(rows, columns // CHUNK, 2, GROUP)
    packed = halves[:, :, 0] | (halves[:, :, 1] << 4)
    return packed.reshape(rows, columns // 2).contiguous(), scales.contiguous()


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The fp32 matrix the 4-bit weights stand for."""
    rows = packed.shape[0]
    chunks = packed.reshape(rows, -1, GROUP)
    q = torch.stack((chunks & 15, chunks >> 4), dim=2).to(torch.float32) - 8  # [N, chunks, 2, 32]
    return (q.reshape(rows, -1, GROUP) * scales[..., None]).reshape(rows, -1)


def round_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., K] as ``matvec_int4`` multiplies it: each group of 32 rounded to int8 with its own
    scale (the group's largest magnitude maps to 127)."""
    grouped = x.float().reshape(*x.shape[:-1], -1, GROUP)
    largest = grouped.abs().amax(-1, keepdim=True)
    inverse = torch.where(largest > 0, 127.0 / largest, torch.zeros_like(largest))  # as the kernel computes it
    return (torch.round(grouped * inverse) * (largest / 127.0)).reshape(x.shape).to(x.dtype)
