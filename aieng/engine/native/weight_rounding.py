"""Running a transformers model's Linear layers on rounded weights (and inputs): how
``aieng eval --dtype`` grades a weight format with the arithmetic serving in it does, on the
model's own forward, without a second copy of the model."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F


def layer_linears(model) -> list[torch.nn.Linear]:
    """Every Linear of the decoder layers (the output projection is not one of them)."""
    return [m for layer in model.model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]


@contextlib.contextmanager
def rounded_linears(
    modules,
    round_weight: Callable[[torch.Tensor], torch.Tensor],
    input_dtype: torch.dtype | None = None,
    round_input: Callable[[torch.Tensor], torch.Tensor] | None = None,
):
    """Run each Linear of ``modules`` on ``round_weight(its weight)`` (its input in ``input_dtype``,
    or through ``round_input``), the product back in the input's dtype, the bias added after; as
    before on exit."""
    patched = []
    for module in modules:
        rounded = round_weight(module.weight)

        def forward(x, module=module, rounded=rounded):
            x_in = x if input_dtype is None else x.to(input_dtype)
            out = F.linear(x_in if round_input is None else round_input(x_in), rounded).to(x.dtype)
            return out if module.bias is None else out + module.bias

        module.forward = forward
        patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward  # back to the class's forward


@contextlib.contextmanager
def bf16_linears(model):
    """Run the decoder layers' Linear layers as the engine's bf16 format does: inputs and weights
    rounded to bf16, the product back in fp32 (the LM head stays fp32, as in the engine).
    For ``aieng eval --dtype bfloat16``: it measures the accuracy of exactly what serving runs."""
    modules = layer_linears(model)
    with rounded_linears(modules, lambda w: w.detach().to(torch.bfloat16), torch.bfloat16):
        yield model
