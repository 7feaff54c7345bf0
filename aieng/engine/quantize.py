"""int8 dynamic quantization of a model's Linear layers (CPU), shared by the engine and ``aieng eval``.

Weights are stored as int8 and activations quantized on the fly per batch. On large CPU models it
halves weight memory traffic; on the tiny demo model the quantize/dequantize work outweighs the
saving (measured by ``aieng bench engine --int8``), which is why it is off by default.
"""

from __future__ import annotations

import torch

from aieng.errors import InvalidRequestError


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    if next(model.parameters()).device.type != "cpu":
        raise InvalidRequestError("int8 dynamic quantization is a CPU option; on CUDA use bf16 or fp16")
    from torch.ao.quantization import quantize_dynamic

    if next(model.parameters()).dtype != torch.float32:  # a bf16 checkpoint kept as it is (device.choose_dtype)
        model = model.float()  # quantize_dynamic rounds fp32 Linear layers and computes the rest in fp32
    return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
